"""The SageMaker path with botocore's Stubber on a real sagemaker-runtime client: answers, throttling, errors."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import boto3
import pytest
from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

from inference.llm import loadtest

ENDPOINT = "falcon-rolling"


@pytest.fixture
def fake_aws(monkeypatch, tmp_path):
    """Fake credentials from the environment and no shared files, so nothing real is found or called."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-west-2",
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)


@pytest.fixture
def stubbed(fake_aws):
    """A real sagemaker-runtime client under a Stubber, and the request bodies it was asked to send."""
    client = boto3.client("sagemaker-runtime", region_name="us-west-2")
    bodies: list[dict] = []
    client.meta.events.register("provide-client-params.sagemaker-runtime.InvokeEndpoint",
                                lambda params, **_: bodies.append(json.loads(params["Body"])))
    with Stubber(client) as stubber:
        yield client, stubber, bodies
        stubber.assert_no_pending_responses()


def answer(stubber, text="one two three four"):
    data = json.dumps({"generated_text": text}).encode()
    stubber.add_response(
        "invoke_endpoint",
        {"Body": StreamingBody(io.BytesIO(data), len(data)), "ContentType": "application/json"},
        {"EndpointName": ENDPOINT, "Body": ANY, "ContentType": "application/json", "Accept": "application/json"},
    )


def model_error(stubber, original_status, message):
    stubber.add_client_error("invoke_endpoint", service_error_code="ModelError", service_message=message,
                             http_status_code=424, modeled_fields={"OriginalStatusCode": original_status})


def test_stubbed_endpoint_run_counts_answers_and_errors_by_kind(stubbed, tmp_path, capsys):
    client, stubber, bodies = stubbed
    answer(stubber)  # warm-up, not measured
    answer(stubber)
    stubber.add_client_error("invoke_endpoint", service_error_code="ThrottlingException",
                             service_message="Rate exceeded", http_status_code=400)
    model_error(stubber, 503, "Received server error (503) from primary")
    model_error(stubber, 0, "Your invocation timed out while waiting for a response from container primary.")
    model_error(stubber, 400, "Received client error (400) from primary")
    stubber.add_client_error("invoke_endpoint", service_error_code="ValidationError",
                             service_message="Endpoint falcon-rolling of account 1 not found.", http_status_code=400)
    answer(stubber)
    answer(stubber)

    target = loadtest.SageMakerTarget(ENDPOINT, timeout=60, client=client)
    status = loadtest.main(["--endpoint", ENDPOINT, "--shape", "256x32", "--requests", "8", "--warmup", "1",
                            "--out", str(tmp_path), "--no-progress"], target=target)
    report = json.loads((tmp_path / "report.json").read_text())
    step = report["steps"][0]
    assert status == 1  # 5 of 8 failed, far over the default 1 %
    assert step["requests"] == 8 and step["ok"] == 3 and step["warmup_requests"] == 1
    assert step["errors"] == {"throttled": 1, "4xx": 2, "5xx": 1, "timeout": 1, "connection": 0, "other": 0}
    assert step["error_examples"]["throttled"] == "ThrottlingException: Rate exceeded"
    assert step["output_total"] == 3 * 4
    assert step["ttfb_s"] is None and "n/a" in report["ttfb_note"]
    assert report["target"] == {"type": "sagemaker", "endpoint": ENDPOINT, "region": "us-west-2"}
    assert len(bodies) == 9 and {body["parameters"]["max_new_tokens"] for body in bodies} == {32}
    table = capsys.readouterr().out
    assert "SageMaker endpoint falcon-rolling (us-west-2)" in table and "n/a" in table


def test_sentiment_batches_on_the_endpoint(stubbed):
    client, stubber, bodies = stubbed
    for _ in range(3):
        data = json.dumps([{"label": "positive", "score": 0.9}] * 4).encode()
        stubber.add_response("invoke_endpoint", {"Body": StreamingBody(io.BytesIO(data), len(data))})
    workload = loadtest.sentiment_workload(batch_size=4)
    target = loadtest.SageMakerTarget("sentiment", client=client)
    report = loadtest.run(target, workload, loadtest.RunSettings([1], requests=3, warmup=0, progress=False),
                          "labels returned")
    assert report["steps"][0]["output_total"] == 12 and report["passed"]
    assert all(len(body["inputs"]) == 4 for body in bodies)


class RaisingClient:
    """Stands in for the client where the Stubber cannot reach: transport errors below the HTTP layer."""

    meta = SimpleNamespace(region_name="us-west-2")

    def __init__(self, error):
        self.error = error

    def invoke_endpoint(self, **_):
        raise self.error


@pytest.mark.parametrize(("error", "kind"), [
    (ReadTimeoutError(endpoint_url="https://runtime.sagemaker"), "timeout"),
    (ConnectTimeoutError(endpoint_url="https://runtime.sagemaker"), "timeout"),
    (EndpointConnectionError(endpoint_url="https://runtime.sagemaker"), "connection"),
])
def test_transport_errors_are_classified(error, kind):
    target = loadtest.SageMakerTarget(ENDPOINT, client=RaisingClient(error))
    assert target.invoke(b"{}").error == kind


def test_an_unforeseen_exception_is_counted_not_fatal():
    target = loadtest.SageMakerTarget(ENDPOINT, client=RaisingClient(ValueError("unexpected")))
    workload = loadtest.llm_workload(8, 4, loadtest.WordCounter())
    step = loadtest.run_step(target, workload, concurrency=2, requests=4, warmup=0)
    assert step["errors"]["other"] == 4 and step["error_examples"]["other"] == "ValueError: unexpected"


def test_client_made_from_the_usual_chain_has_no_retries_and_a_pool_per_client(fake_aws):
    target = loadtest.SageMakerTarget(ENDPOINT, timeout=30, max_connections=32)
    config = target.client.meta.config
    assert target.region == "us-west-2" and config.read_timeout == 30
    assert config.retries["total_max_attempts"] == 1 and config.max_pool_connections == 32


def test_missing_credentials_is_one_line_and_status_3(fake_aws, monkeypatch, capsys):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    assert loadtest.main(["--endpoint", ENDPOINT, "--requests", "1"]) == 3
    assert capsys.readouterr().err.strip().endswith("no AWS credentials found (environment, profile, SSO or "
                                                    "instance role)")


def test_a_containers_429_counts_as_throttled_and_retries_wait_for_its_hint(stubbed, monkeypatch):
    """Our sentiment server's overload through SageMaker: ModelError with OriginalStatusCode 429 and the body as
    OriginalMessage (botocore's sagemaker-runtime model). Without --retries it is throttling; with them the
    request is sent again after the body's retry_after_s."""
    client, stubber, _ = stubbed
    overloaded = json.dumps({"error": "overloaded", "status": 429, "error_type": "overloaded", "retry_after_s": 2})

    def throttled():
        stubber.add_client_error("invoke_endpoint", service_error_code="ModelError", http_status_code=424,
                                 service_message="Received client error (429) from primary",
                                 modeled_fields={"OriginalStatusCode": 429, "OriginalMessage": overloaded})

    target = loadtest.SageMakerTarget(ENDPOINT, client=client)
    workload = loadtest.llm_workload(8, 4, loadtest.WordCounter())
    throttled()
    step = loadtest.run_step(target, workload, concurrency=1, requests=1, warmup=0)
    assert step["errors"]["throttled"] == 1 and step["retries"] == 0
    slept = []
    monkeypatch.setattr(loadtest.time, "sleep", slept.append)
    throttled()
    throttled()
    answer(stubber)
    step = loadtest.run_step(target, workload, concurrency=1, requests=1, warmup=0, retries=2)
    assert step["ok"] == 1 and step["retries"] == 2 and slept == [2.0, 2.0]  # the hint, then max(hint, 2 s)
