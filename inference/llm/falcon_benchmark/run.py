"""One benchmark run: check, deploy each mode, wait, warm up, load-test each shape, tear down, compare.

Switching modes: SageMaker updates an endpoint blue/green, starting the new fleet before it stops the old one
(UpdateEndpoint), so an update in place needs endpoint quota for both fleets. With less quota the run destroys
its Falcon stack between modes and deploys the next one fresh.

Teardown is in a `finally`: a failed step, an exception or Ctrl-C (SIGINT; the CLI turns SIGTERM and SIGHUP
into the same) still destroys every stack this run created, newest first. Stacks that existed before the run
are never destroyed: an existing Falcon stack is only updated, and only with --reuse-existing.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from inference.llm.falcon_benchmark import compare, costs
from inference.llm.falcon_benchmark.aws import Account, CdkRunner, CommandFailed, wait_until
from inference.llm.falcon_benchmark.recipe import differences, streams
from settings import Settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PRECONDITION, EXIT_TEARDOWN, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
WARMUP_PROMPT = "Write one sentence about the sea:"


class StepFailed(Exception):
    """A step failed; the message says which and why. The run stops and tears down."""


class PreconditionFailed(Exception):
    """Credentials, region, bootstrap, quota or an existing stack stop the run before anything is deployed."""


@dataclass(frozen=True)
class Plan:
    settings: Settings
    modes: tuple[str, ...]
    shapes: tuple[str, ...]
    concurrency: tuple[int, ...]
    step_seconds: float
    out: Path
    warmup_per_client: int = 1
    max_error_rate: float = 0.05
    stream: bool = True
    tokenizer: str | None = None
    keep: bool = False
    reuse_existing: bool = False
    dry_run: bool = False
    overrides: dict[str, str] = field(default_factory=dict)  # -c KEY=VALUE for every cdk call

    def stack(self, part: str) -> str:
        return f"{self.settings.stack_prefix}-{part}"

    def context(self, mode: str) -> dict[str, str]:
        return {"env": self.settings.name, **self.overrides, "falcon.enabled": "true", "falcon.batching": mode}


@dataclass
class Benchmark:
    plan: Plan
    account: Account
    runner: CdkRunner
    loadtest: Callable[[list[str]], int]
    out: TextIO = sys.stdout
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    poll_s: float = 30.0
    endpoint_timeout_s: float = 3600.0
    warmup_tries: int = 10
    created: list[str] = field(default_factory=list)  # stacks this run created, in creation order
    existing: set[str] = field(default_factory=set)
    reports: dict[tuple[str, str], dict] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # steps whose error rate exceeded the limit
    endpoint: str = ""
    last_context: dict[str, str] = field(default_factory=dict)
    in_place: bool = True  # switch modes by updating the stack (quota for two fleets) or by replacing it
    billing_started: float | None = None
    billed_s: float = 0.0
    rate: costs.Rate | None = None

    def __post_init__(self) -> None:
        self.started = self.clock()

    def say(self, message: str) -> None:
        print(f"[{self.clock() - self.started:7.1f}s] {message}", file=self.out, flush=True)

    def step(self, name: str, action: Callable[[], str | None]) -> None:
        self.say(f"{name} ...")
        begun = self.clock()
        try:
            detail = action()
        except BaseException as error:
            word = "INTERRUPTED" if isinstance(error, KeyboardInterrupt) else "FAILED"
            self.say(f"{name}: {word} after {self.clock() - begun:.1f}s{': ' + str(error) if str(error) else ''}")
            raise
        self.say(f"{name}: ok ({self.clock() - begun:.1f}s){': ' + detail if detail else ''}")

    # -- before anything is deployed
    def preconditions(self) -> str:
        settings, falcon = self.plan.settings, self.plan.settings.falcon
        try:
            account = self.account.identity()
        except Exception as error:
            raise PreconditionFailed(f"no AWS credentials that work ({type(error).__name__}: {error}); set "
                                     "AWS_PROFILE or run `aws configure`") from None
        if not self.account.region:
            raise PreconditionFailed("no region set: export AWS_REGION (or AWS_DEFAULT_REGION)")
        problems = []
        if self.account.region != settings.region:
            problems.append(f"the credentials' region is {self.account.region} but environment {settings.name} "
                            f"deploys to {settings.region}; export AWS_REGION={settings.region} or pass "
                            f"-c region={self.account.region}")
        if not self.account.bootstrapped():
            problems.append(f"account {account} is not bootstrapped for the CDK in {settings.region}: run npx cdk "
                            f"bootstrap aws://{account}/{settings.region}")
        quota = self.account.endpoint_quota(falcon.instance_type)
        if quota < falcon.max_instances:
            problems.append(f"SageMaker quota '{falcon.instance_type} for endpoint usage' is {quota:g}, the "
                            f"endpoint needs {falcon.max_instances} (request an increase in the Service Quotas "
                            "console)")
        self.existing = {name for name in map(self.plan.stack, ("artifacts", "network", "falcon"))
                         if self.account.stack_exists(name)}
        falcon_stack = self.plan.stack("falcon")
        self.in_place = quota >= 2 * falcon.max_instances
        if falcon_stack in self.existing and not self.plan.reuse_existing:
            problems.append(f"stack {falcon_stack} already exists: a benchmark would change its batching mode; "
                            "pass --reuse-existing to update it in place (it stays up, in the last mode run), or "
                            "use another ENV")
        elif falcon_stack in self.existing and not self.in_place:
            problems.append(f"updating the existing {falcon_stack} runs its old and new instances side by side: the "
                            f"quota '{falcon.instance_type} for endpoint usage' must be at least "
                            f"{2 * falcon.max_instances}, it is {quota:g}")
        if problems:
            raise PreconditionFailed("; ".join(problems))
        for difference in differences(falcon.model_id, falcon.instance_type, falcon.tensor_parallel_degree):
            self.say(f"  note: {difference}: the recipe's published figures are for another set-up")
        if len(self.plan.modes) > 1:
            self.say("  modes switch by updating the endpoint in place (quota for two fleets)" if self.in_place else
                     f"  modes switch by destroying and redeploying {falcon_stack}: an update in place would need "
                     f"quota for {2 * falcon.max_instances} x {falcon.instance_type} (two fleets side by side)")
        self.print_costs()
        return f"account {account}, region {settings.region}, quota {quota:g} x {falcon.instance_type}"

    def print_costs(self) -> None:
        settings = self.plan.settings
        items = [(settings.falcon.instance_type, settings.falcon.min_instances)]
        if self.plan.stack("network") not in self.existing:  # the run creates the network too: count its hours
            interface_endpoints = sum(bool(on) for name, on in vars(settings.network.endpoints).items()
                                      if name != "s3_gateway")
            items += [("nat-gateway", settings.network.nat_gateways),
                      ("interface-endpoint", 2 * interface_endpoints)]  # one per zone, two zones
        self.rate = costs.hourly(settings.region, items)
        for line in self.rate.lines:
            self.say(f"  cost: {line}")
        steps = len(self.plan.shapes) * len(self.plan.concurrency)
        hours = costs.estimate_hours(len(self.plan.modes), steps, self.plan.step_seconds)
        self.say(f"  cost: about ${self.rate.per_hour:.2f} per hour while the endpoint is up; this run: about "
                 f"{hours:.1f} h, ${self.rate.per_hour * hours:.0f} ({len(self.plan.modes)} deploys of about "
                 f"{costs.DEPLOY_MINUTES} min, {steps} load steps of {self.plan.step_seconds:g} s per mode)")
        if self.plan.keep:
            self.say("  cost: --keep: the endpoint keeps costing this much per hour after the run")

    # -- one mode
    def deploy(self, mode: str) -> str:
        context = self.plan.context(mode)
        falcon_stack = self.plan.stack("falcon")
        # Recorded before deploying: a stack whose deploy failed half-way still needs destroying.
        for part in ("artifacts", "network", "falcon"):
            name = self.plan.stack(part)
            if name not in self.existing and name not in self.created:
                self.created.append(name)
        self.last_context = context
        if self.billing_started is None:
            self.billing_started = self.clock()
        try:
            outputs = self.runner.deploy(falcon_stack, context)
        except CommandFailed as error:
            raise StepFailed(str(error)) from None
        self.endpoint = (outputs.get(falcon_stack) or {}).get("EndpointName") or f"{self.plan.settings.name}-falcon"
        return f"endpoint {self.endpoint}, falcon.batching={mode}"

    def replace(self) -> None:
        try:
            self.runner.destroy(self.plan.stack("falcon"), self.last_context)
        except CommandFailed as error:
            raise StepFailed(str(error)) from None

    def wait_in_service(self) -> str:
        seen: dict[str, str] = {}

        def in_service() -> bool:
            status, reason = self.account.endpoint_status(self.endpoint)
            if status != seen.get("status"):
                self.say(f"  {self.endpoint}: {status}")
                seen["status"] = status
            if status == "Failed":
                raise StepFailed(f"endpoint {self.endpoint} failed: {reason}")
            return status == "InService"

        if not wait_until(in_service, self.endpoint_timeout_s, self.poll_s, self.sleep, self.clock):
            raise StepFailed(f"endpoint {self.endpoint} not InService after {self.endpoint_timeout_s:g} s")
        return "InService"

    def warm_up(self) -> str:
        last = ""
        for attempt in range(1, self.warmup_tries + 1):
            try:
                text = self.account.generate(self.endpoint, WARMUP_PROMPT, 16)
                return f"answered after {attempt} attempt{'s' if attempt > 1 else ''}: {text.strip()[:60]!r}"
            except Exception as error:
                last = f"{type(error).__name__}: {error}"
                self.sleep(self.poll_s)
        raise StepFailed(f"{self.endpoint} did not answer a generation in {self.warmup_tries} attempts ({last})")

    def load(self, mode: str, shape: str) -> str:
        folder = self.plan.out / mode / shape
        argv = ["--endpoint", self.endpoint, "--region", self.plan.settings.region, "--kind", "llm", "--shape", shape,
                "--concurrency", ",".join(map(str, self.plan.concurrency)), "--duration", f"{self.plan.step_seconds:g}",
                "--warmup", str(self.plan.warmup_per_client), "--max-error-rate", f"{self.plan.max_error_rate:g}",
                "--out", str(folder), "--label", f"{mode} {shape}"]  # a progress bar shows on a terminal only
        if self.plan.stream and streams(mode):
            argv.append("--stream")
        if self.plan.tokenizer:
            argv += ["--tokenizer", self.plan.tokenizer]
        # LMI's own token count where the container answers "details": true (inference.llm.lmi details_supported).
        argv += ["--lmi-version", self.plan.settings.falcon.lmi_version, "--batching", mode]
        status = self.loadtest(argv)
        report_path = folder / "report.json"
        if report_path.exists():
            self.reports[(mode, shape)] = json.loads(report_path.read_text())
        if status == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
        if status == 1:
            self.problems.append(f"{mode} {shape}: error rate above {self.plan.max_error_rate:.0%}")
            return f"error rate above {self.plan.max_error_rate:.0%} in some step (report kept in {folder})"
        if status != 0:
            raise StepFailed(f"load test of {self.endpoint} ({mode}, {shape}) ended with status {status}")
        return f"report in {folder}"

    # -- the whole run
    def run(self) -> int:
        status = EXIT_OK
        self.say(f"benchmark {', '.join(self.plan.modes)} x {', '.join(self.plan.shapes)} in environment "
                 f"{self.plan.settings.name}; reports in {self.plan.out}")
        try:
            self.step("preconditions", self.preconditions)
            if self.plan.dry_run:
                self.say("dry run: nothing deployed")
                return EXIT_OK
            for index, mode in enumerate(self.plan.modes):
                if index and not self.in_place:
                    self.step(f"destroy {self.plan.stack('falcon')} before the next mode", self.replace)
                self.step(f"deploy falcon.batching={mode}", lambda mode=mode: self.deploy(mode))
                self.step(f"wait for {self.endpoint}", self.wait_in_service)
                self.step("warm up", self.warm_up)
                for shape in self.plan.shapes:
                    self.step(f"load {mode} {shape}", lambda mode=mode, shape=shape: self.load(mode, shape))
        except PreconditionFailed as error:
            self.say(f"precondition failed: {error}")
            return EXIT_PRECONDITION
        except StepFailed:
            status = EXIT_FAILED
        except KeyboardInterrupt:
            self.say("interrupted: tearing down")
            status = EXIT_INTERRUPTED
        except Exception as error:  # a bug or an unexpected AWS answer: still tear down
            self.say(f"unexpected {type(error).__name__}: {error}")
            traceback.print_exc()
            status = EXIT_FAILED
        finally:
            torn_down = self.teardown() if not self.plan.dry_run else True
            if not self.plan.dry_run:
                self.finish()
        if not torn_down:
            return EXIT_TEARDOWN
        if status == EXIT_OK and self.problems:
            self.say("finished, but " + "; ".join(self.problems))
            return EXIT_FAILED
        return status

    def teardown(self) -> bool:
        """Destroy what this run created, newest first; False when something may still be running."""
        if self.plan.keep:
            if self.created or self.billing_started is not None:
                self.say(f"teardown skipped (--keep): {self.endpoint or 'the endpoint'} stays up and keeps costing "
                         f"${(self.rate.per_hour if self.rate else 0):.2f}/h")
            self._stop_billing()
            return True
        left: list[str] = []
        order = list(reversed(self.created))
        for index, name in enumerate(order):
            try:
                self.step(f"destroy {name}", lambda name=name: self.runner.destroy(name, self.last_context))
            except KeyboardInterrupt:  # a second Ctrl-C: stop, and say what is left
                left += order[index:]
                break
            except Exception:
                left.append(name)
        self._stop_billing()
        kept = [name for name in map(self.plan.stack, ("falcon",)) if name in self.existing]
        if kept and self.billing_started is not None:
            self.say(f"{kept[0]} existed before the run and stays up, now with falcon.batching="
                     f"{self.last_context.get('falcon.batching')}; redeploy it to restore its own settings")
        if left:
            self.say("TEARDOWN INCOMPLETE: these stacks may still be running and costing money; destroy them by hand:")
            for name in left:
                self.say(f"  {self.runner.destroy_command(name, self.last_context)}")
            return False
        if self.plan.stack("artifacts") in self.created:
            self.say("retained by design: the artifact bucket and its KMS key (see the artifacts stack's outputs)")
        return True

    def _stop_billing(self) -> None:
        if self.billing_started is not None and not self.billed_s:
            self.billed_s = self.clock() - self.billing_started

    def finish(self) -> None:
        """The comparison table, files and picture from whatever finished, and the cost of the run."""
        if not self.reports:
            if self.billing_started is not None:
                self.say("no load step finished: nothing to compare")
        else:
            entries = compare.rows(self.plan.modes, self.plan.shapes, self.reports)
            print("\n" + compare.format_table(entries) + "\n", file=self.out, flush=True)
            summary = {"tool": "inference.llm.falcon_benchmark", "environment": self.plan.settings.name,
                       "model_id": self.plan.settings.falcon.model_id,
                       "instance_type": self.plan.settings.falcon.instance_type,
                       "modes": list(self.plan.modes), "shapes": list(self.plan.shapes),
                       "concurrency": list(self.plan.concurrency), "step_seconds": self.plan.step_seconds,
                       "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
                       "endpoint_hours": round(self.billed_s / 3600, 3),
                       "cost_usd": round(self.cost(), 2) if self.rate else None}
            for path in compare.write(entries, summary, self.plan.out):
                self.say(f"wrote {path}")
            try:
                picture = compare.draw(self.plan.modes, self.plan.shapes, self.reports, self.plan.out / "compare.png")
                self.say(f"wrote {picture}")
            except ImportError:
                self.say("no picture: matplotlib is not installed")
        if self.rate and self.billed_s:
            self.say(f"cost of this run: about ${self.cost():.2f} ({self.billed_s / 3600:.2f} h at "
                     f"${self.rate.per_hour:.2f}/h from the first deploy to the end of teardown; an update between "
                     "modes briefly runs old and new instances side by side)")

    def cost(self) -> float:
        return (self.rate.per_hour if self.rate else 0.0) * self.billed_s / 3600
