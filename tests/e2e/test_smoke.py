"""The smoke test's orchestration, offline: moto for S3/STS/SSM/Logs, Stubber for quotas and endpoints,
and a fake CDK runner that plays the training instance's part."""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber
from moto import mock_aws

from tests.e2e import smoke

REGION = "us-west-2"
BUCKET = "smoke-artifacts"
LOG_GROUP = "smoke-training-logs"


@dataclass
class FakeRunner:
    """Records deploys and destroys; writes the training run's marker when the training stack deploys."""

    s3: object
    logs: object
    training_outcome: str = "success"
    interrupt_on: str | None = None
    fail_destroy: str | None = None
    deploys: list[tuple[list[str], dict[str, str]]] = field(default_factory=list)
    destroys: list[str] = field(default_factory=list)

    def deploy(self, stacks, context):
        self.deploys.append((list(stacks), dict(context)))
        if self.interrupt_on and any(s.endswith(self.interrupt_on) for s in stacks):
            raise KeyboardInterrupt
        outputs = {}
        for name in stacks:
            part = name.rsplit("-", 1)[-1]
            outputs[name] = {
                "artifacts": {"ArtifactBucketName": BUCKET},
                "training": {"LogGroupName": LOG_GROUP},
                "sentiment": {"EndpointName": "smoke-sentiment"},
                "falcon": {"EndpointName": "smoke-falcon"},
            }.get(part, {})
            if part == "training":
                self._play_training_run(context["training.run_id"])
        return outputs

    def _play_training_run(self, run_id: str) -> None:
        prefix = f"models/sentiment/{run_id}/"
        self.logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=f"{run_id}/steps")
        self.logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=f"{run_id}/steps", logEvents=[
            {"timestamp": int(time.time() * 1000), "message": f"[run {run_id}] step: train"}])
        if self.training_outcome == "success":
            self.s3.put_object(Bucket=BUCKET, Key=prefix + "model.tar.gz", Body=b"\x1f\x8bmodel")
            self.s3.put_object(Bucket=BUCKET, Key=prefix + "_SUCCESS", Body=b"ok")
        else:
            self.s3.put_object(Bucket=BUCKET, Key=prefix + "_FAILED", Body=b"step=train\nexit_status=3\n")

    def destroy(self, stacks, context):
        self.destroys.extend(stacks)
        if self.fail_destroy and any(s.endswith(self.fail_destroy) for s in stacks):
            raise smoke.StepFailed("stack is in DELETE_FAILED")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _body(payload) -> StreamingBody:
    data = json.dumps(payload).encode()
    return StreamingBody(io.BytesIO(data), len(data))


@pytest.fixture
def world(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        session = boto3.Session(region_name=REGION)
        s3, logs = session.client("s3"), session.client("logs")
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        logs.create_log_group(logGroupName=LOG_GROUP)
        session.client("ssm").put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="30", Type="String")
        quotas = session.client("service-quotas")
        runtime = session.client("sagemaker-runtime")
        yield session, s3, logs, quotas, runtime


def _stub_quotas(stubber: Stubber, g_vcpus: float = 8, endpoint_quota: float = 2) -> None:
    stubber.add_response("get_service_quota", {"Quota": {"QuotaCode": "L-DB2E81BA", "Value": g_vcpus}},
                         {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA"})
    stubber.add_response("list_service_quotas", {"Quotas": [
        {"QuotaName": "ml.c7g.large for endpoint usage", "Value": endpoint_quota},
        {"QuotaName": "ml.g5.2xlarge for endpoint usage", "Value": endpoint_quota},
        {"QuotaName": "ml.g5.48xlarge for endpoint usage", "Value": 0}]}, {"ServiceCode": "sagemaker"})


class JsonBody:
    """Matches a request body (bytes) that parses to `expected`: what the endpoint reads, whatever the spacing."""

    def __init__(self, expected):
        self.expected = expected

    def __eq__(self, other) -> bool:
        return isinstance(other, bytes | bytearray) and json.loads(other) == self.expected

    def __repr__(self) -> str:
        return f"JsonBody({self.expected!r})"


def invoke_request(endpoint: str, payload) -> dict:
    """InvokeEndpoint as the handler's and LMI's contracts want it: JSON in, JSON out."""
    return {"EndpointName": endpoint, "ContentType": "application/json", "Accept": "application/json",
            "Body": JsonBody(payload)}


# The recipe's sanity sentence first (expected: negative), then the other three the tool sends.
SENTENCES = ["Covid cases are increasing fast!", "What a wonderful morning, the sun is out.",
             "The meeting is at 3pm in room 4.", "This update broke everything again."]
# LMI answers only max_new_tokens tokens (default 30): the request must always carry it.
FALCON_REQUEST = {"inputs": "Write one sentence about why load testing matters:", "parameters": {"max_new_tokens": 48}}


def _stub_endpoints(stubber: Stubber) -> None:
    labels = ["negative", "positive", "neutral", "negative"]
    stubber.add_response("invoke_endpoint", {"Body": _body([[{"label": label, "score": 0.9}] for label in labels]),
                                             "ContentType": "application/json"},
                         invoke_request("smoke-sentiment", {"inputs": SENTENCES}))
    stubber.add_response("invoke_endpoint", {"Body": _body([{"generated_text": "Because users arrive at once."}]),
                                             "ContentType": "application/json"},
                         invoke_request("smoke-falcon", FALCON_REQUEST))


def run(world, stubs, argv=(), **runner_options):
    """Run the smoke test's main() against moto, with `stubs(quota_stubber, runtime_stubber)` set up first."""
    session, s3, logs, quotas, runtime = world
    runner = FakeRunner(s3=s3, logs=logs, **runner_options)
    loadtests: list[list[str]] = []
    clock, out = FakeClock(), io.StringIO()
    with Stubber(quotas) as quota_stub, Stubber(runtime) as runtime_stub:
        stubs(quota_stub, runtime_stub)
        account = smoke.Account(session, clients={"service-quotas": quotas, "sagemaker-runtime": runtime})
        status = smoke.main(list(argv), account=account, runner=runner,
                            loadtest=lambda args: loadtests.append(args) or 0, out=out,
                            sleep=clock.sleep, clock=clock, run_id="smoke-test-run")
        quota_stub.assert_no_pending_responses()
        runtime_stub.assert_no_pending_responses()
    return status, runner, loadtests, out.getvalue()


def everything(quota_stub, runtime_stub):
    _stub_quotas(quota_stub)
    _stub_endpoints(runtime_stub)


def quotas_only(quota_stub, runtime_stub):
    _stub_quotas(quota_stub)


def test_happy_path_deploys_in_order_with_the_right_overrides_and_tears_everything_down(world):
    status, runner, loadtests, out = run(world, everything)
    assert status == 0, out
    stacks = [names for names, _ in runner.deploys]
    assert stacks == [["mlrecipes-smoke-artifacts", "mlrecipes-smoke-network", "mlrecipes-smoke-operations"],
                      ["mlrecipes-smoke-training"], ["mlrecipes-smoke-sentiment"], ["mlrecipes-smoke-falcon"]]
    contexts = [context for _, context in runner.deploys]
    assert all(c["env"] == "smoke" for c in contexts)
    assert contexts[1]["training.enabled"] == "true" and contexts[1]["training.run_id"] == "smoke-test-run"
    assert contexts[2]["sentiment.model_data_url"] == f"s3://{BUCKET}/models/sentiment/smoke-test-run/model.tar.gz"
    assert contexts[3]["falcon.enabled"] == "true"
    assert runner.destroys == ["mlrecipes-smoke-falcon", "mlrecipes-smoke-sentiment", "mlrecipes-smoke-training",
                               "mlrecipes-smoke-operations", "mlrecipes-smoke-network", "mlrecipes-smoke-artifacts"]
    assert [args[args.index("--endpoint") + 1] for args in loadtests] == ["smoke-sentiment", "smoke-falcon"]
    assert "--shape" in loadtests[1] and "32x128" in loadtests[1]
    assert "step: train" in out  # the run's log is shown while waiting
    # Each sentence is shown with its own answer, in the order sent; the generated text is shown once.
    assert [line.split()[2:] for line in out.splitlines() if line.strip().endswith(tuple(SENTENCES))] == [
        ["negative", "0.900", *SENTENCES[0].split()], ["positive", "0.900", *SENTENCES[1].split()],
        ["neutral", "0.900", *SENTENCES[2].split()], ["negative", "0.900", *SENTENCES[3].split()]]
    assert out.count("falcon | Because users arrive at once.") == 1
    assert f"retained by design: artifact bucket {BUCKET}" in out
    assert "about $" in out and "per hour" in out
    summary = out[out.index("\nstep "):]
    for step in ("preconditions", "wait for the training run", "predict", "generate", "destroy mlrecipes-smoke-falcon"):
        assert step in summary


def test_failed_training_run_stops_and_still_tears_down(world):
    status, runner, loadtests, out = run(world, quotas_only, training_outcome="failed")
    assert status == 1
    assert [names for names, _ in runner.deploys][-1] == ["mlrecipes-smoke-training"]
    assert "failed in step 'train'" in out
    assert runner.destroys == ["mlrecipes-smoke-training", "mlrecipes-smoke-operations", "mlrecipes-smoke-network",
                               "mlrecipes-smoke-artifacts"]
    assert loadtests == []


def test_a_quota_too_low_stops_before_anything_is_deployed(world):
    status, runner, _, out = run(world, lambda q, _: _stub_quotas(q, g_vcpus=0, endpoint_quota=0))
    assert status == 3
    assert runner.deploys == [] and runner.destroys == []
    assert "'Running On-Demand G and VT instances' is 0 vCPUs, g5.xlarge needs 4" in out
    assert "'ml.g5.2xlarge for endpoint usage' is 0, need 1" in out
    assert "teardown: nothing was deployed" in out


def test_interruption_tears_down_what_was_started_and_says_so(world):
    status, runner, _, out = run(world, quotas_only, interrupt_on="sentiment")
    assert status == 130
    assert "interrupted" in out
    assert runner.destroys[0] == "mlrecipes-smoke-sentiment"  # started, so it is destroyed too
    assert runner.destroys[-1] == "mlrecipes-smoke-artifacts" and len(runner.destroys) == 5


def test_a_failing_destroy_is_reported_and_the_rest_still_destroyed(world):
    status, runner, _, out = run(world, everything, fail_destroy="sentiment")
    assert status == 0
    assert len(runner.destroys) == 6
    assert "destroy mlrecipes-smoke-sentiment: FAILED" in out


def test_keep_leaves_the_stacks_up(world):
    status, runner, _, out = run(world, everything, ["--keep"])
    assert status == 0 and runner.destroys == []
    assert "teardown skipped (--keep)" in out


def test_only_falcon_deploys_the_base_and_falcon(world):
    def stubs(quota_stub, runtime_stub):
        quota_stub.add_response("list_service_quotas", {"Quotas": [
            {"QuotaName": "ml.g5.2xlarge for endpoint usage", "Value": 1}]}, {"ServiceCode": "sagemaker"})
        runtime_stub.add_response("invoke_endpoint", {"Body": _body([{"generated_text": "ok then"}])},
                                  invoke_request("smoke-falcon", FALCON_REQUEST))

    status, runner, loadtests, _ = run(world, stubs, ["--only", "falcon"])
    assert status == 0
    assert [names for names, _ in runner.deploys] == [
        ["mlrecipes-smoke-artifacts", "mlrecipes-smoke-network", "mlrecipes-smoke-operations"],
        ["mlrecipes-smoke-falcon"]]
    assert len(loadtests) == 1


def test_not_bootstrapped_is_a_precondition_failure(world):
    session = world[0]
    session.client("ssm").delete_parameter(Name="/cdk-bootstrap/hnb659fds/version")
    status, runner, _, out = run(world, quotas_only)
    assert status == 3 and runner.deploys == []
    assert "not bootstrapped" in out and "npx cdk bootstrap aws://" in out


def test_usage_errors():
    assert smoke.main(["--only", "sentiment"]) == 2
    assert smoke.main(["-c", "training.max_hours=0"]) == 2
    with pytest.raises(SystemExit) as exit_info:
        smoke.main(["--help"])
    assert exit_info.value.code == 0
