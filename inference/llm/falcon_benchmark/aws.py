"""The two outside worlds of a benchmark run: the repository's CDK CLI and a handful of AWS calls.

Both are small classes so tests can hand in a stand-in CLI (any command) and stubbed boto3 clients.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from settings import REPO_ROOT


class CommandFailed(RuntimeError):
    """A deploy or destroy command ended with a non-zero status."""


class CdkRunner:
    """`npx cdk deploy|destroy` with the run's context flags, output streamed to the terminal."""

    def __init__(self, cwd: Path = REPO_ROOT, command: Sequence[str] = ("npx", "cdk")) -> None:
        self.cwd, self.command = cwd, list(command)

    @staticmethod
    def flags(context: dict[str, str]) -> list[str]:
        return [flag for key, value in context.items() for flag in ("-c", f"{key}={value}")]

    def deploy(self, stack: str, context: dict[str, str]) -> dict[str, dict[str, str]]:
        """Deploy `stack` and the stacks it depends on (network, artifacts); returns the CLI's outputs file."""
        with tempfile.TemporaryDirectory() as folder:
            outputs = Path(folder) / "outputs.json"
            command = [*self.command, "deploy", "--require-approval", "never", "--no-notices",
                       "--outputs-file", str(outputs), *self.flags(context), stack]
            if subprocess.run(command, cwd=self.cwd, check=False).returncode != 0:
                raise CommandFailed(f"cdk deploy {stack} failed (its output is above)")
            return json.loads(outputs.read_text()) if outputs.exists() else {}

    def synth(self, stack: str, context: dict[str, str]) -> bool:
        """Whether `stack` synthesizes with `context` (offline: settings, LMI and GPU memory checks, cdk-nag)."""
        with tempfile.TemporaryDirectory() as folder:
            command = [*self.command, "synth", "--quiet", "--no-notices", "--output", folder, *self.flags(context),
                       stack]
            return subprocess.run(command, cwd=self.cwd, check=False, stdout=subprocess.DEVNULL).returncode == 0

    def destroy(self, stack: str, context: dict[str, str]) -> None:
        command = [*self.command, "destroy", "--force", "--exclusively", "--no-notices", *self.flags(context),
                   stack]
        if subprocess.run(command, cwd=self.cwd, check=False).returncode != 0:
            raise CommandFailed(f"cdk destroy {stack} failed")

    def destroy_command(self, stack: str, context: dict[str, str]) -> str:
        """What to run by hand when a teardown could not finish."""
        return " ".join([*self.command, "destroy", "--force", "--exclusively", *self.flags(context), stack])


class Account:
    """The AWS calls a run makes, on one boto3 session; `clients` replaces any of them (tests: Stubber)."""

    def __init__(self, session, clients: dict[str, Any] | None = None) -> None:
        self.session = session
        self._clients = dict(clients or {})

    def client(self, name: str):
        if name not in self._clients:
            self._clients[name] = self.session.client(name)
        return self._clients[name]

    @property
    def region(self) -> str | None:
        return self.session.region_name if self.session is not None else None

    def identity(self) -> str:
        return self.client("sts").get_caller_identity()["Account"]

    def bootstrapped(self, qualifier: str = "hnb659fds") -> bool:
        ssm = self.client("ssm")
        try:
            ssm.get_parameter(Name=f"/cdk-bootstrap/{qualifier}/version")
            return True
        except ssm.exceptions.ParameterNotFound:
            return False

    def endpoint_quota(self, instance_type: str) -> float:
        """SageMaker's '<instance> for endpoint usage' quota (0 when the account lists none)."""
        paginator = self.client("service-quotas").get_paginator("list_service_quotas")
        wanted = f"{instance_type} for endpoint usage"
        for page in paginator.paginate(ServiceCode="sagemaker"):
            for quota in page["Quotas"]:
                if quota["QuotaName"] == wanted:
                    return quota["Value"]
        return 0.0

    def stack_exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            stacks = self.client("cloudformation").describe_stacks(StackName=name)["Stacks"]
        except ClientError as error:
            if "does not exist" in str(error):
                return False
            raise
        return any(stack["StackStatus"] != "DELETE_COMPLETE" for stack in stacks)

    def endpoint_status(self, name: str) -> tuple[str, str]:
        """(EndpointStatus, FailureReason or "")."""
        answer = self.client("sagemaker").describe_endpoint(EndpointName=name)
        return answer["EndpointStatus"], answer.get("FailureReason", "")

    def generate(self, endpoint: str, prompt: str, max_new_tokens: int) -> str:
        response = self.client("sagemaker-runtime").invoke_endpoint(
            EndpointName=endpoint, ContentType="application/json", Accept="application/json",
            Body=json.dumps({"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens}}).encode())
        answer = json.loads(response["Body"].read())
        item = answer[0] if isinstance(answer, list) and answer else answer
        return item.get("generated_text", "") if isinstance(item, dict) else ""


def wait_until(check: Callable[[], bool], timeout_s: float, poll_s: float,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> bool:
    """Poll `check` until it is true or `timeout_s` has passed; bounded however long each check takes."""
    deadline = clock() + timeout_s
    while True:
        if check():
            return True
        if clock() >= deadline:
            return False
        sleep(poll_s)
