"""The prediction client: boto3 path with a botocore Stubber, --url path against the local server."""

from __future__ import annotations

import io
import json
import threading

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from inference.sentiment import predict, serve


def _body(data: bytes) -> StreamingBody:
    return StreamingBody(io.BytesIO(data), len(data))


@pytest.fixture
def runtime():
    client = boto3.client("sagemaker-runtime", region_name="eu-west-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def test_endpoint_prints_label_score_text(runtime, capsys):
    client, stubber = runtime
    answer = [{"label": "negative", "score": 0.91}, {"label": "positive", "score": 0.8}]
    stubber.add_response(
        "invoke_endpoint",
        {"Body": _body(json.dumps(answer).encode()), "ContentType": "application/json"},
        {"EndpointName": "sentiment", "ContentType": "application/json", "Accept": "application/json",
         "Body": json.dumps({"inputs": ["Covid cases are increasing fast!", "yay"]}).encode()},
    )
    assert predict.main(["--endpoint", "sentiment", "Covid cases are increasing fast!", "yay"], client) == 0
    assert capsys.readouterr().out.splitlines() == [
        "negative\t0.9100\tCovid cases are increasing fast!",
        "positive\t0.8000\tyay",
    ]


def test_endpoint_model_error_exits_1_with_the_first_line(runtime, capsys):
    client, stubber = runtime
    stubber.add_client_error(
        "invoke_endpoint",
        service_error_code="ModelError",
        service_message="Received client error (413) from primary",
        http_status_code=424,
        modeled_fields={
            "OriginalStatusCode": 413,
            "OriginalMessage": '{"error": "too many", "status": 413}\nTraceback (most recent call last): ...',
        },
    )
    assert predict.main(["--endpoint", "sentiment", "x"], client) == 1
    err = capsys.readouterr().err
    assert "ModelError (model answered 413)" in err and "too many" in err and "Traceback" not in err


def test_endpoint_with_an_unexpected_body_exits_1(runtime, capsys):
    client, stubber = runtime
    stubber.add_response("invoke_endpoint", {"Body": _body(b"[]")})
    assert predict.main(["--endpoint", "sentiment", "x"], client) == 1
    assert "unexpected response" in capsys.readouterr().err


def test_usage_errors_exit_2(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    for argv in (["x"], ["--endpoint", "a", "--url", "http://h", "x"], ["--url", "http://h", "--top-k", "0", "x"],
                 ["--url", "ftp://h", "x"], ["--endpoint", "e"]):
        with pytest.raises(SystemExit) as raised:
            predict.main(argv)
        assert raised.value.code == 2


@pytest.fixture(scope="module")
def server_url(model_dir):
    running = serve.make_server(model_dir, "127.0.0.1", 0)
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running.url
    running.shutdown()
    running.server_close()


def test_url_with_top_k_and_stdin(server_url, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("great game\n\nawful referee\n"))
    assert predict.main(["--url", server_url, "--top-k", "2"]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [line[2] for line in lines] == ["great game", "great game", "awful referee", "awful referee"]
    assert {line[0] for line in lines} <= {"negative", "neutral", "positive"}


def test_url_client_error_exits_1(server_url, capsys):
    assert predict.main(["--url", server_url, "--top-k", "4", "hello"]) == 1
    assert "HTTP 422" in capsys.readouterr().err


def test_url_unreachable_exits_1(capsys):
    assert predict.main(["--url", "http://127.0.0.1:9", "--timeout", "2", "hello"]) == 1
    assert "error: http://127.0.0.1:9/invocations" in capsys.readouterr().err
