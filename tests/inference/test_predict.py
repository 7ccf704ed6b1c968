"""The prediction client: boto3 path with a botocore Stubber, --url path against a local HTTP server answering
through the handler our server runs."""

from __future__ import annotations

import io
import json
import threading

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from inference.sentiment import predict


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
    """POST /invocations answered in process by `inference.sentiment.inference` (our server's request and response
    library) on the tiny model: its JSON, or a ClientError's status and one-line body."""
    import http.server

    from inference.sentiment import inference as handler

    model = handler.model_fn(str(model_dir))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            try:
                request = handler.input_fn(body, self.headers.get("Content-Type"))
                status, answer = 200, handler.output_fn(handler.predict_fn(request, model), handler.JSON)[0]
            except handler.ClientError as error:
                status, answer = error.status_code, error.message
            data = (answer + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", handler.JSON)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    running = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{running.server_address[1]}"
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


# --- retrying on the original status (issue 32) -------------------------------------------------------------------

def _model_error(stubber, status: int, body: str) -> None:
    """What InvokeEndpoint answers when the container answered `status` (botocore's sagemaker-runtime model:
    ModelError, HTTP 424, OriginalStatusCode, OriginalMessage)."""
    stubber.add_client_error("invoke_endpoint", service_error_code="ModelError", http_status_code=424,
                             service_message=f"Received client error ({status}) from primary",
                             modeled_fields={"OriginalStatusCode": status, "OriginalMessage": body})


OVERLOADED = json.dumps({"error": "overloaded: 256 texts already wait", "status": 429, "error_type": "overloaded",
                         "retry_after_s": 3}) + "\n"


def test_endpoint_429_is_retried_after_the_hint_or_the_backoff_then_answers(runtime, capsys):
    client, stubber = runtime
    _model_error(stubber, 429, OVERLOADED)
    _model_error(stubber, 503, '{"error": "stopping", "status": 503}')
    stubber.add_response("invoke_endpoint", {"Body": _body(b'[{"label": "positive", "score": 0.7}]')})
    slept = []
    assert predict.main(["--endpoint", "sentiment", "x"], client, sleep=slept.append) == 0
    assert slept == [3, 2]  # the body's hint (3 s) over the first backoff (1 s); then the backoff (2 s)
    captured = capsys.readouterr()
    assert captured.out == "positive\t0.7000\tx\n" and "answered 429; retrying in 3 s (1 of 3)" in captured.err


def test_endpoint_retries_end_and_other_statuses_are_not_retried(runtime, capsys):
    client, stubber = runtime
    for _ in range(2):
        _model_error(stubber, 429, OVERLOADED)
    slept = []
    assert predict.main(["--endpoint", "sentiment", "--retries", "1", "x"], client, sleep=slept.append) == 1
    assert slept == [3] and "ModelError (model answered 429): " in capsys.readouterr().err
    _model_error(stubber, 500, '{"error": "internal error", "status": 500}')
    assert predict.main(["--endpoint", "sentiment", "x"], client, sleep=slept.append) == 1
    assert slept == [3]  # a 500 is not sent again


def test_url_429_is_retried(capsys):
    import http.server

    answers = [(429, OVERLOADED.encode()), (200, b'[{"label": "negative", "score": 0.6}]')]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            status, body = answers.pop(0)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        slept = []
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert predict.main(["--url", url, "y"], sleep=slept.append) == 0
        assert slept == [3] and capsys.readouterr().out == "negative\t0.6000\ty\n"
    finally:
        server.shutdown()
        server.server_close()
