"""Start the environment's SageMaker training pipeline (training.backend=sagemaker) and follow it to the end.

Shows step states, the training job's status, metrics and log lines as they come, and ends with the
registered model package and its model.tar.gz URI, or with the failing step and why. Ctrl-C stops only the
following: the execution keeps running, and the command to stop it is printed.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

PROG = "python -m training.pipeline_cli"
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TERMINAL = ("Succeeded", "Failed", "Stopped")
# Exit status, also listed in --help.
EXIT_REGISTERED, EXIT_FAILED, EXIT_USAGE, EXIT_BELOW_BAR, EXIT_STOPPED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EPILOG = """exit status:
  0    the model passed the quality gate and is registered (PendingManualApproval)
  1    a step failed (the step and its reason are printed)
  2    usage or setup error (unknown environment, pipeline not deployed, no credentials)
  3    trained, but below training.min_macro_recall: not registered
  4    the execution was stopped
  130  Ctrl-C: the execution keeps running (the command to stop it is printed)
"""


class SetupError(RuntimeError):
    """Nothing was started: the message says what to fix."""


def pipeline_name(env: str) -> tuple[str, str]:
    """(pipeline name, region) for an environment, as stacks/sagemaker_pipeline.py names it."""
    from settings import SettingsError, load_settings

    try:
        settings = load_settings(env)
    except SettingsError as error:
        raise SetupError(str(error)) from error
    return f"{settings.stack_prefix}-sentiment-training", settings.region


@dataclass
class Follower:
    """What has been shown so far, so each poll prints only what is new."""

    out: Callable[[str], None]
    step_states: dict[str, str] = field(default_factory=dict)
    job_name: str | None = None
    job_status: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    log_start: int = 0
    seen_events: set[str] = field(default_factory=set)

    def steps(self, steps: list[dict]) -> None:
        for step in steps:
            name, status = step["StepName"], step.get("StepStatus", "?")
            if self.step_states.get(name) != status:
                self.step_states[name] = status
                reason = f": {step['FailureReason']}" if step.get("FailureReason") else ""
                self.out(f"step {name}: {status}{reason}")
            job_arn = step.get("Metadata", {}).get("TrainingJob", {}).get("Arn")
            if job_arn and self.job_name is None:
                self.job_name = job_arn.rsplit("/", 1)[-1]
                self.out(f"training job {self.job_name}")

    def job(self, job: dict) -> None:
        status = f"{job.get('TrainingJobStatus')}/{job.get('SecondaryStatus')}"
        if status != self.job_status:
            self.job_status = status
            message = job.get("SecondaryStatusTransitions", [{}])[-1].get("StatusMessage", "")
            self.out(f"  job {status}{' - ' + message if message else ''}")
        for metric in job.get("FinalMetricDataList", []):
            name, value = metric["MetricName"], metric["Value"]
            if self.metrics.get(name) != value:
                self.metrics[name] = value
                self.out(f"  metric {name} = {value:.4f}")

    def logs(self, events: list[dict]) -> None:
        for event in events:
            if event["eventId"] in self.seen_events:
                continue
            self.seen_events.add(event["eventId"])
            self.log_start = max(self.log_start, event["timestamp"])
            self.out(f"  | {event['message'].rstrip()}")


def _error_code(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Code", "")


def start(sagemaker, name: str, region: str) -> str:
    from botocore.exceptions import ClientError

    try:
        response = sagemaker.start_pipeline_execution(
            PipelineName=name,
            PipelineExecutionDisplayName=f"make-train-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}",
            PipelineExecutionDescription="Started by make train",
            ClientRequestToken=uuid.uuid4().hex,
        )
    except ClientError as error:
        if _error_code(error) in ("ResourceNotFound", "ValidationException"):
            raise SetupError(f"pipeline {name} not found in {region}: deploy the environment with "
                             "-c training.backend=sagemaker first") from error
        raise
    return response["PipelineExecutionArn"]


def poll(sagemaker, logs, arn: str, follower: Follower) -> dict:
    """One look at the execution, its steps, the training job and its new log lines; the execution back."""
    from botocore.exceptions import ClientError

    execution = sagemaker.describe_pipeline_execution(PipelineExecutionArn=arn)
    steps = sagemaker.list_pipeline_execution_steps(PipelineExecutionArn=arn, SortOrder="Ascending")
    follower.steps(steps.get("PipelineExecutionSteps", []))
    if follower.job_name:
        # The ARN spells the name in lower case (SageMaker names are case-insensitive); log streams use the
        # name as created, which the description gives.
        job = sagemaker.describe_training_job(TrainingJobName=follower.job_name)
        follower.job(job)
        try:
            found = logs.filter_log_events(logGroupName=LOG_GROUP, logStreamNamePrefix=job["TrainingJobName"] + "/",
                                           startTime=follower.log_start)
            follower.logs(found.get("events", []))
        except ClientError as error:
            if _error_code(error) != "ResourceNotFoundException":  # no stream yet while instances start
                raise
    execution["_steps"] = steps.get("PipelineExecutionSteps", [])
    return execution


def outcome(sagemaker, execution: dict, out: Callable[[str], None]) -> int:
    """The final lines and the exit status of a finished execution."""
    status = execution["PipelineExecutionStatus"]
    steps = execution["_steps"]
    if status == "Succeeded":
        registered = next((s for s in steps if s.get("Metadata", {}).get("RegisterModel")), None)
        if registered is None:
            out("succeeded, but no model was registered")
            return EXIT_FAILED
        package_arn = registered["Metadata"]["RegisterModel"]["Arn"]
        package = sagemaker.describe_model_package(ModelPackageName=package_arn)
        model_url = package["InferenceSpecification"]["Containers"][0]["ModelDataUrl"]
        out(f"registered: {package_arn} ({package.get('ModelApprovalStatus')})")
        out(f"model.tar.gz: {model_url}")
        out(f"deploy it: approve the package, then -c sentiment.enabled=true -c sentiment.model_data_url={model_url}")
        return EXIT_REGISTERED
    if status == "Stopped":
        out("the execution was stopped")
        return EXIT_STOPPED
    below_bar = next((s for s in steps if s.get("Metadata", {}).get("Fail")), None)
    if below_bar is not None:
        out(f"not registered: step {below_bar['StepName']}: {below_bar['Metadata']['Fail'].get('ErrorMessage', '')}")
        return EXIT_BELOW_BAR
    failed = next((s for s in steps if s.get("StepStatus") == "Failed"), None)
    if failed is not None:
        out(f"failed: step {failed['StepName']}: {failed.get('FailureReason', 'no reason given')}")
    else:
        out(f"failed: {execution.get('FailureReason', 'no reason given')}")
    return EXIT_FAILED


def follow(sagemaker, logs, arn: str, region: str, *, interval: float, out: Callable[[str], None],
           sleep: Callable[[float], None] = time.sleep) -> int:
    follower = Follower(out)
    try:
        while True:
            execution = poll(sagemaker, logs, arn, follower)
            if execution["PipelineExecutionStatus"] in TERMINAL:
                return outcome(sagemaker, execution, out)
            sleep(interval)
    except KeyboardInterrupt:
        out("")
        out(f"stopped following; the execution keeps running: {arn}")
        out(f"follow it again:  {PROG} --attach {arn} --region {region}")
        out(f"stop it:          aws sagemaker stop-pipeline-execution --region {region} "
            f"--pipeline-execution-arn {arn}")
        return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="dev", help="environment whose pipeline runs (default: dev)")
    parser.add_argument("--region", help="AWS region (default: the environment's)")
    parser.add_argument("--attach", metavar="EXECUTION_ARN", help="follow a running execution instead of starting one")
    parser.add_argument("--no-follow", action="store_true", help="start and print the execution ARN only")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between polls (default: 30)")
    return parser


def main(argv: list[str] | None = None, *, session=None, sleep: Callable[[float], None] = time.sleep) -> int:
    args = build_parser().parse_args(argv)
    out = print  # progress goes to stdout, one line per change

    def say(line: str) -> None:
        out(line, flush=True)

    try:
        name, default_region = pipeline_name(args.env)
        region = args.region or default_region
        if session is None:
            import boto3

            session = boto3.session.Session(region_name=region)
        sagemaker, logs = session.client("sagemaker"), session.client("logs")
        if args.attach:
            arn = args.attach
        else:
            arn = start(sagemaker, name, region)
            say(f"started {name}: {arn}")
        if args.no_follow:
            print(arn)
            return EXIT_REGISTERED
        return follow(sagemaker, logs, arn, region, interval=args.interval, out=say, sleep=sleep)
    except SetupError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:  # botocore's credential and endpoint errors, named without a traceback
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(error, (BotoCoreError, ClientError)):
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        raise


if __name__ == "__main__":
    sys.exit(main())
