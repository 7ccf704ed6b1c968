"""Prove the whole system in a real AWS account for a few dollars, then tear it down.

Deploys the `smoke` environment step by step: network and artifacts, a one-epoch training run on one GPU,
the sentiment endpoint with that run's model, predictions and a short load test, Falcon-7B with a
generation and a short load test. Prints a summary, then destroys every stack it created (the artifact bucket
is retained by design, and named), also when a step fails or you press Ctrl-C.

    make e2e                                    # everything
    python -m tests.e2e.smoke --only falcon     # one part (network and artifacts come along)
    python -m tests.e2e.smoke --keep            # leave the stacks up

Exit status: 0 every step passed, 1 a step failed, 2 bad arguments, 3 a precondition failed, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from settings import REPO_ROOT, Settings, SettingsError, load_settings
from stacks.instances import vcpus

ENVIRONMENT = "smoke"
PARTS = ("training", "sentiment", "falcon")
SENTENCES = ["Covid cases are increasing fast!", "What a wonderful morning, the sun is out.",
             "The meeting is at 3pm in room 4.", "This update broke everything again."]
FALCON_PROMPT = "Write one sentence about why load testing matters:"

# Approximate on-demand list prices in USD per hour, for the estimate printed before anything starts.
# Check the AWS pricing pages for current figures; regions not listed fall back to us-east-1's.
PRICES: dict[str, dict[str, float]] = {
    "us-east-1": {"g5.xlarge": 1.006, "p4d.24xlarge": 32.77, "ml.c7g.large": 0.0816, "ml.c7g.4xlarge": 0.653,
                  "ml.g5.2xlarge": 1.515, "ml.g5.48xlarge": 20.36, "nat-gateway": 0.045, "interface-endpoint": 0.01},
    "us-west-2": {"g5.xlarge": 1.006, "p4d.24xlarge": 32.77, "ml.c7g.large": 0.0816, "ml.c7g.4xlarge": 0.653,
                  "ml.g5.2xlarge": 1.515, "ml.g5.48xlarge": 20.36, "nat-gateway": 0.045, "interface-endpoint": 0.01},
    "eu-west-1": {"g5.xlarge": 1.123, "p4d.24xlarge": 35.39, "ml.c7g.large": 0.0912, "ml.c7g.4xlarge": 0.730,
                  "ml.g5.2xlarge": 1.691, "ml.g5.48xlarge": 22.72, "nat-gateway": 0.048, "interface-endpoint": 0.011},
}
# EC2 On-Demand vCPU quotas by instance family letter (Service Quotas codes).
EC2_QUOTAS = {"g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
              "p": ("L-417A185B", "Running On-Demand P instances")}
EC2_STANDARD_QUOTA = ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")


class StepFailed(Exception):
    """A step of the smoke test failed; the message says which and why."""


class PreconditionFailed(Exception):
    """The account or the settings are not ready for the smoke test; nothing was deployed."""


def stack_name(settings: Settings, part: str) -> str:
    return f"{settings.stack_prefix}-{part}"


# --- the two outside worlds: the CDK CLI and AWS ------------------------------------------------------------

class CdkRunner:
    """Deploys and destroys stacks with the repository's pinned CDK CLI (`npx cdk`)."""

    def __init__(self, cwd: Path = REPO_ROOT, command: Sequence[str] = ("npx", "cdk")) -> None:
        self.cwd, self.command = cwd, list(command)

    def _flags(self, context: dict[str, str]) -> list[str]:
        return [flag for key, value in context.items() for flag in ("-c", f"{key}={value}")]

    def deploy(self, stacks: Sequence[str], context: dict[str, str]) -> dict[str, dict[str, str]]:
        with tempfile.TemporaryDirectory() as folder:
            outputs_file = Path(folder) / "outputs.json"
            command = [*self.command, "deploy", "--exclusively", "--require-approval", "never", "--no-notices",
                       "--outputs-file", str(outputs_file), *self._flags(context), *stacks]
            if subprocess.run(command, cwd=self.cwd, check=False).returncode != 0:
                raise StepFailed(f"cdk deploy {' '.join(stacks)} failed (see its output above)")
            return json.loads(outputs_file.read_text()) if outputs_file.exists() else {}

    def destroy(self, stacks: Sequence[str], context: dict[str, str]) -> None:
        command = [*self.command, "destroy", "--force", "--exclusively", "--no-notices", *self._flags(context),
                   *stacks]
        if subprocess.run(command, cwd=self.cwd, check=False).returncode != 0:
            raise StepFailed(f"cdk destroy {' '.join(stacks)} failed")


class Account:
    """The AWS calls the smoke test makes, on one boto3 session (tests give it moto or stubbed clients)."""

    def __init__(self, session, clients: dict[str, Any] | None = None) -> None:
        self.session = session
        self._clients = dict(clients or {})

    def client(self, name: str):
        if name not in self._clients:
            self._clients[name] = self.session.client(name)
        return self._clients[name]

    @property
    def region(self) -> str | None:
        return self.session.region_name

    def identity(self) -> str:
        return self.client("sts").get_caller_identity()["Account"]

    def bootstrapped(self, qualifier: str = "hnb659fds") -> bool:
        try:
            self.client("ssm").get_parameter(Name=f"/cdk-bootstrap/{qualifier}/version")
            return True
        except self.client("ssm").exceptions.ParameterNotFound:
            return False

    def ec2_vcpu_quota(self, code: str) -> float:
        return self.client("service-quotas").get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]

    def sagemaker_quotas(self) -> dict[str, float]:
        quotas: dict[str, float] = {}
        paginator = self.client("service-quotas").get_paginator("list_service_quotas")
        for page in paginator.paginate(ServiceCode="sagemaker"):
            for quota in page["Quotas"]:
                quotas[quota["QuotaName"]] = quota["Value"]
        return quotas

    def marker(self, bucket: str, prefix: str) -> tuple[str, str] | None:
        """("success" | "failed", marker text) once the run wrote one, else None."""
        s3 = self.client("s3")
        for name, outcome in (("_FAILED", "failed"), ("_SUCCESS", "success")):
            try:
                body = s3.get_object(Bucket=bucket, Key=f"{prefix}{name}")["Body"].read().decode(errors="replace")
                return outcome, body
            except s3.exceptions.NoSuchKey:
                continue
        return None

    def log_lines(self, group: str, since_ms: int) -> list[tuple[int, str]]:
        try:
            events = self.client("logs").filter_log_events(logGroupName=group, startTime=since_ms).get("events", [])
        except self.client("logs").exceptions.ResourceNotFoundException:
            return []
        return [(e["timestamp"], e["message"].rstrip()) for e in events]

    def invoke(self, endpoint: str, payload: dict) -> Any:
        response = self.client("sagemaker-runtime").invoke_endpoint(
            EndpointName=endpoint, ContentType="application/json", Accept="application/json",
            Body=json.dumps(payload).encode())
        return json.loads(response["Body"].read())


# --- the smoke test ------------------------------------------------------------------------------------------

@dataclass
class StepResult:
    name: str
    status: str
    seconds: float
    detail: str = ""


@dataclass
class SmokeTest:
    settings: Settings
    account: Account
    runner: CdkRunner
    loadtest: Callable[[list[str]], int]
    parts: tuple[str, ...] = PARTS
    keep: bool = False
    model_data_url: str | None = None
    out: TextIO = sys.stdout
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    poll_seconds: float = 30.0
    run_id: str = field(default_factory=lambda: "smoke-" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S"))
    context: dict[str, str] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    results: list[StepResult] = field(default_factory=list)
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.started = self.clock()
        self.context = {"env": ENVIRONMENT, **self.context}

    # -- printing and timing
    def say(self, message: str) -> None:
        print(f"[{self.clock() - self.started:7.1f}s] {message}", file=self.out, flush=True)

    def step(self, name: str, action: Callable[[], str | None]) -> str | None:
        self.say(f"{name} ...")
        start = self.clock()
        try:
            detail = action()
        except BaseException as error:
            status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
            self.results.append(StepResult(name, status, self.clock() - start, str(error)))
            self.say(f"{name}: {status.upper()} after {self.clock() - start:.1f}s: {error}")
            raise
        self.results.append(StepResult(name, "ok", self.clock() - start, detail or ""))
        self.say(f"{name}: ok ({self.clock() - start:.1f}s){': ' + detail if detail else ''}")
        return detail

    # -- preconditions
    def estimate(self) -> tuple[float, list[str]]:
        region = self.settings.region
        prices = PRICES.get(region)
        notes = [] if prices else [f"no price table for {region}; using us-east-1 prices"]
        prices = prices or PRICES["us-east-1"]
        items = [("nat-gateway", self.settings.network.nat_gateways),
                 ("interface-endpoint", 2 * sum(on for name, on in vars(self.settings.network.endpoints).items()
                                                if name != "s3_gateway"))]
        if "training" in self.parts:
            items.append((self.settings.training.instance_type, 1))
        if "sentiment" in self.parts:
            items.append((self.settings.sentiment.instance_type, self.settings.sentiment.min_instances))
        if "falcon" in self.parts:
            items.append((self.settings.falcon.instance_type, self.settings.falcon.min_instances))
        total = 0.0
        for item, count in items:
            if item not in prices:
                notes.append(f"no price for {item}")
                continue
            total += prices[item] * count
            notes.append(f"{count} x {item} at ${prices[item]:.3f}/h")
        return total, notes

    def preconditions(self) -> str:
        problems = []
        try:
            account = self.account.identity()
        except Exception as error:
            raise PreconditionFailed(f"no AWS credentials that work ({type(error).__name__}: {error}); "
                                     "set AWS_PROFILE or run `aws configure`") from None
        if not self.account.region:
            raise PreconditionFailed("no region set: export AWS_REGION (or AWS_DEFAULT_REGION)")
        if self.account.region != self.settings.region:
            problems.append(f"the credentials' region is {self.account.region} but the smoke environment deploys "
                            f"to {self.settings.region}; pass -c region=... or export AWS_REGION")
        if not self.account.bootstrapped():
            problems.append(f"account {account} is not bootstrapped for the CDK in {self.settings.region}: "
                            f"run npx cdk bootstrap aws://{account}/{self.settings.region}")
        problems += self.quota_shortfalls()
        if problems:
            raise PreconditionFailed("; ".join(problems))
        total, notes = self.estimate()
        for note in notes:
            self.say(f"  cost: {note}")
        self.say(f"  cost: about ${total:.2f} per hour while everything runs")
        return f"account {account}, region {self.settings.region}"

    def quota_shortfalls(self) -> list[str]:
        shortfalls = []
        if "training" in self.parts:
            instance = self.settings.training.instance_type
            code, name = EC2_QUOTAS.get(instance[0], EC2_STANDARD_QUOTA)
            have, need = self.account.ec2_vcpu_quota(code), vcpus(instance)
            if have < need:
                shortfalls.append(f"EC2 quota '{name}' is {have:g} vCPUs, {instance} needs {need}")
        wanted = []
        if "sentiment" in self.parts:
            wanted.append((self.settings.sentiment.instance_type, self.settings.sentiment.max_instances))
        if "falcon" in self.parts:
            wanted.append((self.settings.falcon.instance_type, self.settings.falcon.max_instances))
        if wanted:
            quotas = self.account.sagemaker_quotas()
            for instance, count in wanted:
                have = quotas.get(f"{instance} for endpoint usage", 0)
                if have < count:
                    shortfalls.append(f"SageMaker quota '{instance} for endpoint usage' is {have:g}, need {count}")
        if shortfalls:
            shortfalls[-1] += " (request increases in the Service Quotas console)"
        return shortfalls

    # -- deploying
    def deploy(self, parts: Sequence[str], **context: str) -> None:
        self.context.update(context)
        names = [stack_name(self.settings, part) for part in parts]
        # Recorded before deploying: a stack whose deploy failed half-way still needs destroying.
        self.created.extend(n for n in names if n not in self.created)
        self.outputs.update(self.runner.deploy(names, dict(self.context)))

    def output(self, part: str, key: str) -> str:
        try:
            return self.outputs[stack_name(self.settings, part)][key]
        except KeyError:
            raise StepFailed(f"stack {stack_name(self.settings, part)} has no output {key}") from None

    def wait_for_run(self) -> str:
        bucket = self.output("artifacts", "ArtifactBucketName")
        prefix = f"models/sentiment/{self.run_id}/"
        group = self.output("training", "LogGroupName")
        deadline = self.clock() + (self.settings.training.max_hours + 0.5) * 3600
        seen_ms = int(time.time() * 1000) - 60_000
        while self.clock() < deadline:
            for timestamp, line in self.account.log_lines(group, seen_ms):
                self.say(f"  log | {line}")
                seen_ms = max(seen_ms, timestamp + 1)
            marker = self.account.marker(bucket, prefix)
            if marker and marker[0] == "success":
                self.model_data_url = f"s3://{bucket}/{prefix}model.tar.gz"
                return f"model at {self.model_data_url}"
            if marker:
                failed = dict(line.split("=", 1) for line in marker[1].splitlines() if "=" in line)
                raise StepFailed(f"training run {self.run_id} failed in step '{failed.get('step', '?')}' "
                                 f"(logs and checkpoints in s3://{bucket}/{prefix})")
            self.sleep(self.poll_seconds)
        raise StepFailed(f"no _SUCCESS or _FAILED under s3://{bucket}/{prefix} after "
                         f"{self.settings.training.max_hours + 0.5} h")

    def deploy_sentiment(self) -> None:
        if not self.model_data_url:
            raise StepFailed("the sentiment endpoint needs a model: run with training or --model-data-url")
        self.deploy(["sentiment"], **{"sentiment.enabled": "true", "sentiment.model_data_url": self.model_data_url})

    def predict(self) -> str:
        endpoint = self.output("sentiment", "EndpointName")
        results = self.account.invoke(endpoint, {"inputs": SENTENCES})
        if not isinstance(results, list) or len(results) != len(SENTENCES):
            raise StepFailed(f"{endpoint} answered {results!r}, not one result per sentence")
        for sentence, result in zip(SENTENCES, results, strict=True):
            best = result[0] if isinstance(result, list) else result
            self.say(f"  {best.get('label', '?'):>8} {best.get('score', 0):.3f}  {sentence}")
        first = results[0][0] if isinstance(results[0], list) else results[0]
        return f"'{SENTENCES[0]}' -> {first.get('label')}"

    def generate(self) -> str:
        endpoint = self.output("falcon", "EndpointName")
        answer = self.account.invoke(endpoint, {"inputs": FALCON_PROMPT, "parameters": {"max_new_tokens": 48}})
        text = answer[0]["generated_text"] if isinstance(answer, list) else answer.get("generated_text")
        if not text:
            raise StepFailed(f"{endpoint} answered {answer!r} without generated_text")
        self.say(f"  falcon | {text.strip()[:200]}")
        return f"{len(text.split())} words generated"

    def load(self, part: str, kind_args: list[str]) -> str:
        endpoint = self.output(part, "EndpointName")
        status = self.loadtest(["--endpoint", endpoint, "--region", self.settings.region, *kind_args,
                                "--concurrency", "1,4", "--requests", "20", "--warmup", "2",
                                "--max-error-rate", "0.05"])
        if status != 0:
            raise StepFailed(f"load test of {endpoint} ended with status {status} (error rate above 5%?)")
        return "error rate within 5%"

    # -- the whole run
    def run(self) -> int:
        status = 0
        try:
            self.step("preconditions", self.preconditions)
            self.step("deploy network and artifacts", lambda: self.deploy(["artifacts", "network", "operations"]))
            if "training" in self.parts:
                self.step(f"deploy training run {self.run_id}",
                          lambda: self.deploy(["training"], **{"training.enabled": "true",
                                                               "training.run_id": self.run_id}))
                self.step("wait for the training run", self.wait_for_run)
            if "sentiment" in self.parts:
                self.step("deploy the sentiment endpoint", self.deploy_sentiment)
                self.step("predict", self.predict)
                self.step("load test sentiment", lambda: self.load("sentiment", ["--kind", "sentiment"]))
            if "falcon" in self.parts:
                self.step("deploy Falcon", lambda: self.deploy(["falcon"], **{"falcon.enabled": "true"}))
                self.step("generate", self.generate)
                self.step("load test Falcon", lambda: self.load("falcon", ["--kind", "llm", "--shape", "32x128"]))
        except PreconditionFailed as error:
            self.say(f"precondition failed: {error}")
            status = 3
        except StepFailed:
            status = 1
        except KeyboardInterrupt:
            self.say("interrupted")
            status = 130
        finally:
            self.teardown()
            self.summary()
        return status

    def teardown(self) -> None:
        if not self.created:
            self.say("teardown: nothing was deployed")
            return
        if self.keep:
            self.say(f"teardown skipped (--keep): {', '.join(self.created)} stay up and keep costing money")
            return
        for name in reversed(self.created):
            try:
                self.step(f"destroy {name}", lambda name=name: self.runner.destroy([name], dict(self.context)))
            except Exception:
                continue
        bucket = self.outputs.get(stack_name(self.settings, "artifacts"), {}).get("ArtifactBucketName")
        if bucket:
            self.say(f"retained by design: artifact bucket {bucket} (and its KMS key); empty and delete it by hand "
                     "when you no longer need the models")

    def summary(self) -> None:
        width = max((len(r.name) for r in self.results), default=10)
        print(f"\n{'step'.ljust(width)}  status       seconds  detail", file=self.out)
        for result in self.results:
            print(f"{result.name.ljust(width)}  {result.status:<11}  {result.seconds:7.1f}  {result.detail[:90]}",
                  file=self.out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.smoke", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=PARTS, help="run one part (network and artifacts are always deployed)")
    parser.add_argument("--keep", action="store_true", help="leave the stacks up at the end")
    parser.add_argument("--model-data-url", help="with --only sentiment: an s3://.../model.tar.gz to host")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting override for the smoke environment, as with cdk -c")
    return parser


def main(argv: list[str] | None = None, *, account: Account | None = None, runner: CdkRunner | None = None,
         loadtest: Callable[[list[str]], int] | None = None, out: TextIO = sys.stdout, **options: Any) -> int:
    args = build_parser().parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.context if "=" in item)
    try:
        settings = load_settings(ENVIRONMENT, overrides)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.only == "sentiment" and not args.model_data_url:
        print("error: --only sentiment needs --model-data-url s3://.../model.tar.gz", file=sys.stderr)
        return 2
    if account is None:
        import boto3

        account = Account(boto3.Session())
    if loadtest is None:
        from inference.llm import loadtest as loadtest_module

        loadtest = loadtest_module.main
    smoke = SmokeTest(settings=settings, account=account, runner=runner or CdkRunner(), loadtest=loadtest,
                      parts=(args.only,) if args.only else PARTS, keep=args.keep,
                      model_data_url=args.model_data_url, context=overrides, out=out, **options)
    return smoke.run()


if __name__ == "__main__":
    sys.exit(main())
