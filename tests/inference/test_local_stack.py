"""The tiny archive under the real serving stack of the endpoint's image: TorchServe 0.12 + SageMaker toolkit 2.0.25.

What a client of the endpoint sees: status, Content-Type and body, for good requests and every class of bad
request. Needs `make serving-stack` (.venv-serving and Java); `make test` installs it and sets
REQUIRE_SERVING_STACK=1 so that a missing stack fails instead of skipping.
"""

from __future__ import annotations

import http.client
import json
import os

import pytest

from inference.sentiment import local_stack

pytestmark = [pytest.mark.torchserve, pytest.mark.skipif(
    not local_stack.SERVING_PYTHON.is_file() and not os.environ.get("REQUIRE_SERVING_STACK"),
    reason="no .venv-serving; run `make serving-stack`",
)]
JSON = "application/json"
GOOD = json.dumps({"inputs": ["lovely weather", "terrible service"]}).encode()


@pytest.fixture(scope="module")
def stack(archive, tmp_path_factory):
    log = tmp_path_factory.mktemp("stack") / "stack.log"
    running = local_stack.LocalStack(archive, log=log)
    try:
        running.start()
    except local_stack.StackError:
        pytest.fail(f"stack did not start; last log lines:\n{log.read_text()[-3000:] if log.exists() else ''}")
    yield running
    running.stop()


def post(stack, body, content_type=JSON, accept=None):
    """(status, Content-Type, body) of one POST /invocations."""
    headers = {"Content-Type": content_type} if content_type else {}
    if accept:
        headers["Accept"] = accept
    connection = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=60)
    try:
        connection.request("POST", "/invocations", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        connection.close()


def test_ping_and_the_environment_the_stack_sets(stack):
    connection = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=10)
    connection.request("GET", "/ping")
    assert connection.getresponse().status == 200
    env = stack.environment()
    assert env["TS_DEFAULT_SERVICE_HANDLER"] == "sentiment_service:handle"
    assert env["TS_INFERENCE_ADDRESS"] == f"http://127.0.0.1:{stack.port}"
    assert env["OMP_NUM_THREADS"] == str(stack.vcpus - stack.vcpus // 8)  # one worker; 1 in 8 kept from 8 vCPUs


@pytest.mark.parametrize(("body", "content_type", "accept", "shape"), [
    (GOOD, JSON, None, 2),
    (b'{"inputs": "just one"}', JSON, JSON, 1),
    (b'{"inputs": "no content type at all"}', None, None, 1),
    (b'{"inputs": "charset given"}', "application/json; charset=utf-8", "*/*", 1),
    ('{"inputs": ["caf\u00e9 \u2615", "ok"], "parameters": {"top_k": 3}}'.encode(), JSON, None, 2),
])
def test_good_requests_are_json_predictions(stack, body, content_type, accept, shape):
    status, response_type, response = post(stack, body, content_type, accept)
    assert (status, response_type) == (200, JSON), response
    predictions = json.loads(response)
    assert len(predictions) == shape
    for entry in predictions:
        for ranked in entry if isinstance(entry, list) else [entry]:
            assert ranked["label"] in {"negative", "neutral", "positive"} and 0 <= ranked["score"] <= 1
    if b"top_k" in body:
        assert all(len(entry) == 3 for entry in predictions)


BAD_UTF8 = b'{"inputs": "caf\xe9 \xff"}'


@pytest.mark.parametrize(("body", "content_type", "accept", "status"), [
    # Bytes that are not UTF-8, in every type the toolkit or the handler decodes (the toolkit's own decode of
    # application/json and text/csv used to make these a 500 with a traceback).
    (BAD_UTF8, JSON, None, 400),
    (BAD_UTF8, "text/csv", None, 400),
    (BAD_UTF8, "application/json; charset=utf-8", None, 400),
    (BAD_UTF8, None, None, 400),
    (b"{not json", JSON, None, 400),
    (b"", JSON, None, 400),
    (b'{"text": "no inputs"}', JSON, None, 400),
    (b'{"inputs": []}', JSON, None, 400),
    (b'{"inputs": [1]}', JSON, None, 400),
    (b'{"inputs": "a", "parameters": {"top_k": false}}', JSON, None, 400),
    (b'{"inputs": "a", "parameters": {"top_k": 0}}', JSON, None, 422),
    (b'{"inputs": "a", "parameters": {"top_k": 9}}', JSON, None, 422),
    (json.dumps({"inputs": ["a"] * 65}).encode(), JSON, None, 413),
    (json.dumps({"inputs": "a" * 5001}).encode(), JSON, None, 413),
    (b'{"inputs": "a"}', "text/csv", None, 415),
    (b'{"inputs": "a"}', "text/plain", None, 415),
    (b'{"inputs": "a"}', "application/json; charset=latin-1", None, 415),
    (b'{"inputs": "a"}', JSON, "text/csv", 406),
])
def test_client_mistakes_are_4xx_with_one_line_of_json(stack, body, content_type, accept, status):
    got, response_type, response = post(stack, body, content_type, accept)
    assert got == status, response
    assert response_type == JSON
    text = response.decode()
    assert text.endswith("\n") and text.count("\n") == 1, "one line, no traceback"
    error = json.loads(text)
    assert set(error) == {"error", "status"} and error["status"] == status and error["error"]


def test_the_worker_keeps_serving_after_errors(stack):
    for body in (BAD_UTF8, b"{not json", b'{"inputs": []}'):
        post(stack, body)
    assert post(stack, GOOD)[0] == 200


def test_a_saved_model_directory_gets_the_code_an_archive_carries(model_dir, tmp_path):
    local_stack.extract(model_dir, tmp_path / "model")
    assert (tmp_path / "model" / "code" / "inference.py").read_text() == (
        local_stack.ROOT / "inference" / "sentiment" / "inference.py").read_text()
    assert (tmp_path / "model" / "code" / "sentiment_service.py").is_file()


def test_what_is_not_a_model_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(local_stack.StackError, match="neither a directory nor a tar archive"):
        local_stack.extract(tmp_path / "notes.txt", tmp_path / "a")
    (tmp_path / "empty").mkdir()
    with pytest.raises(local_stack.StackError, match=r"needs config\.json"):
        local_stack.extract(tmp_path / "empty", tmp_path / "b")


def test_a_second_stack_is_refused_while_one_runs(stack, archive):
    [pid] = local_stack.torchserve_pids()
    with pytest.raises(local_stack.StackError, match=rf"already runs on this machine.*pid {pid} \(java .*"
                                                     rf"stop it with: kill -TERM {pid}"):
        local_stack.LocalStack(archive).start()
