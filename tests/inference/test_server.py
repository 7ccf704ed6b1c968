"""Our server as the image runs it: `python -m inference.sentiment.server serve` from .venv-image (the image's
pinned requirements), on today's model.tar.gz, over HTTP.

Good requests, every class of bad request the retired TorchServe path answered (the table its own test had, same
statuses and one-line JSON bodies), batching correctness (concurrent clients each get
their own answer, the one they get alone), overload (429 at once, never a 5xx, also from 200 clients at once),
and stopping (SIGTERM under load drains the accepted requests and exits 0 within 25 s, SIGINT exits 130, a signal
during start-up, nothing left, the port free). Needs `make
image-venv`, which `make test` runs; under CI=true a missing venv fails (tests/conftest.py `prerequisite`).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time

import psutil
import pytest

from inference.sentiment.server import local
from tests.conftest import prerequisite

pytestmark = [pytest.mark.servers,
              prerequisite(local.IMAGE_PYTHON.is_file(), "no .venv-image; run `make image-venv`")]
JSON = "application/json"
GOOD = json.dumps({"inputs": ["lovely weather", "terrible service"]}).encode()
BAD_UTF8 = b'{"inputs": "caf\xe9 \xff"}'

# These tests are about the server's mechanics (batching, overload, signals), not its choice of engine: fp32 skips the
# start-up race (its accuracy check still runs); the choice is tested in test_calibration.py and test_precision.py.
FP32 = ("--precision", "fp32")


def post(port, body, content_type=JSON, accept=None, timeout=60):
    """(status, headers, body) of one POST /invocations on a fresh connection."""
    headers = {"Content-Type": content_type} if content_type else {}
    if accept:
        headers["Accept"] = accept
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", "/invocations", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def get(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def session_processes(server: local.LocalServer) -> list[psutil.Process]:
    """Live processes of the server's session (it runs in one of its own)."""
    left = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getsid(process.pid) == server.process.pid and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return left


@pytest.fixture(scope="module")
def server(archive, tmp_path_factory):
    """Today's archive (training.package, code/ and all) under our server; batches wait up to 200 ms for company."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    running = local.LocalServer(archive, args=(*FP32, "--max-batch-wait-ms", "200"), log=log)
    running.start()
    yield running
    assert running.stop() == 0


@pytest.mark.parametrize(("body", "content_type", "accept", "shape"), [
    (GOOD, JSON, None, 2),
    (b'{"inputs": "just one"}', JSON, JSON, 1),
    (b'{"inputs": "no content type at all"}', None, None, 1),
    (b'{"inputs": "charset given"}', "application/json; charset=utf-8", "*/*", 1),
    ('{"inputs": ["caf\u00e9 \u2615", "ok"], "parameters": {"top_k": 3}}'.encode(), JSON, None, 2),
])
def test_good_requests_are_json_predictions(server, body, content_type, accept, shape):
    status, headers, response = post(server.port, body, content_type, accept)
    assert (status, headers["content-type"]) == (200, JSON), response
    predictions = json.loads(response)
    assert len(predictions) == shape
    for entry in predictions:
        for ranked in entry if isinstance(entry, list) else [entry]:
            assert ranked["label"] in {"negative", "neutral", "positive"} and 0 <= ranked["score"] <= 1
    if b"top_k" in body:
        assert all(len(entry) == 3 for entry in predictions)


def test_ping_says_healthy(server):
    assert get(server.port, "/ping") == (200, b'{"status": "healthy"}\n')


# The retired TorchServe path's table, plus what only an HTTP server of our own can get wrong.
@pytest.mark.parametrize(("body", "content_type", "accept", "status"), [
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
    (b"x" * (6 * 1024 * 1024 + 1), JSON, None, 413),
])
def test_client_mistakes_are_4xx_with_one_line_of_json(server, body, content_type, accept, status):
    got, headers, response = post(server.port, body, content_type, accept)
    assert got == status, response
    assert headers["content-type"] == JSON
    text = response.decode()
    assert text.endswith("\n") and text.count("\n") == 1, "one line, no traceback"
    error = json.loads(text)
    assert set(error) == {"error", "status"} and error["status"] == status and error["error"]


def test_unknown_routes_are_json_404_and_405(server):
    status, body = get(server.port, "/nope")
    assert status == 404 and json.loads(body)["status"] == 404
    status, body = get(server.port, "/invocations")
    assert status == 405 and json.loads(body)["status"] == 405


def test_the_worker_keeps_serving_after_errors(server):
    for body in (BAD_UTF8, b"{not json", b'{"inputs": []}'):
        post(server.port, body)
    assert post(server.port, GOOD)[0] == 200


def test_concurrent_clients_each_get_their_own_answer_the_one_they_get_alone(server):
    texts = [f"client {index}: the {'service was great' if index % 3 else 'bus never came'} today "
             + "and " * index for index in range(16)]
    top_k = {text: (3 if index % 4 == 0 else None) for index, text in enumerate(texts)}

    def body(text):
        payload = {"inputs": text}
        if top_k[text]:
            payload["parameters"] = {"top_k": top_k[text]}
        return json.dumps(payload).encode()

    alone = {}
    for text in texts:
        status, headers, response = post(server.port, body(text))
        assert status == 200 and headers["x-batch-texts"] == "1"
        alone[text] = json.loads(response)
    together, start = {}, threading.Barrier(len(texts))

    def client(text):
        start.wait()
        together[text] = post(server.port, body(text))

    threads = [threading.Thread(target=client, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(together[text][0] == 200 for text in texts)
    assert max(int(together[text][1]["x-batch-texts"]) for text in texts) > 1, "no request was batched"
    for text in texts:
        answer = json.loads(together[text][2])
        expected = alone[text]
        assert len(answer) == len(expected) == 1
        got_rows = answer[0] if top_k[text] else [answer[0]]
        want_rows = expected[0] if top_k[text] else [expected[0]]
        assert [row["label"] for row in got_rows] == [row["label"] for row in want_rows], text
        # Padding to a batch neighbour's length can change float rounding, never the answer.
        assert all(abs(g["score"] - w["score"]) < 1e-5 for g, w in zip(got_rows, want_rows, strict=True)), text


def test_an_overloaded_server_answers_429_at_once_with_the_retry_hint_and_the_queued_request_gets_its_answer(
        archive, tmp_path):
    # One text fills the queue, and a batch waits up to 1 s for company: of six requests sent at once, one is
    # queued and answered after that second; the other five are refused while it waits.
    with local.LocalServer(archive, args=(*FP32, "--max-queue", "1", "--max-batch-wait-ms", "1000"),
                           log=tmp_path / "server.log") as running:
        results, start = {}, threading.Barrier(6)

        def client(index):
            start.wait()
            status, headers, response = post(running.port, json.dumps({"inputs": f"text {index}"}).encode())
            results[index] = (time.monotonic(), status, headers, response)

        clients = [threading.Thread(target=client, args=(index,)) for index in range(6)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(30)
        statuses = sorted(result[1] for result in results.values())
        assert statuses == [200] + [429] * 5
        answered_at = next(result[0] for result in results.values() if result[1] == 200)
        for finished_at, status, headers, response in results.values():
            if status == 429:
                assert finished_at < answered_at, "a 429 waited behind the queued request"
                assert headers["retry-after"] == "1" and headers["content-type"] == JSON
                error = json.loads(response)
                assert (error["status"], error["error_type"], error["retry_after_s"]) == (429, "overloaded", 1)
                assert response.count(b"\n") == 1


def test_200_clients_at_once_against_a_small_queue_get_only_200_and_429_and_it_still_answers(archive, tmp_path):
    """What `make serve-local MODEL=... ARGS="--max-queue 8"` runs, hit by 200 clients at the same moment: every
    answer is 200 or 429 (never a 5xx, which SageMaker counts in Invocation5XXErrors), every client gets one."""
    with local.LocalServer(archive, args=(*FP32, "--max-queue", "8", "--workers", "2"),
                           log=tmp_path / "server.log") as running:
        results: dict[int, int | str] = {}
        start = threading.Barrier(200)

        def client(index):
            start.wait()
            try:
                results[index] = post(running.port, json.dumps({"inputs": f"text number {index}"}).encode())[0]
            except OSError as error:
                results[index] = f"{type(error).__name__}: {error}"

        clients = [threading.Thread(target=client, args=(index,)) for index in range(200)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(60)
        counts = {status: list(results.values()).count(status) for status in set(results.values())}
        assert len(results) == 200 and set(counts) <= {200, 429}, counts
        assert counts.get(200, 0) >= 8 and counts.get(429, 0) > 0, counts  # served a queue's worth, refused the rest
        assert post(running.port, GOOD)[0] == 200 and get(running.port, "/ping")[0] == 200


def test_sigterm_under_load_answers_every_accepted_request_and_exits_0_within_25_s(archive, tmp_path):
    """Two replicas; eight requests wait in their batches (1 s for company) and eight clients keep sending while
    SIGTERM arrives. Every request the server accepted is answered (200), the others are refused by a closed
    port or connection (never a 5xx), and the server exits 0 well inside SageMaker's 30 s."""
    running = local.LocalServer(archive, args=(*FP32, "--workers", "2", "--max-batch-wait-ms", "1000"),
                                log=tmp_path / "server.log").start()
    port = running.port
    stop = threading.Event()
    load: list[int | str] = []
    try:
        def hammer():
            while not stop.is_set():
                try:
                    load.append(post(port, GOOD, timeout=30)[0])
                except OSError as error:
                    load.append(type(error).__name__)  # refused or closed: never accepted
                    time.sleep(0.01)

        hammers = [threading.Thread(target=hammer) for _ in range(8)]
        for thread in hammers:
            thread.start()
        while len(load) < 16:
            time.sleep(0.01)
        answers = {}
        queued = [threading.Thread(target=lambda i=i: answers.update({i: post(port, GOOD)})) for i in range(8)]
        for client in queued:
            client.start()
        time.sleep(0.3)  # the server has read them; each waits up to 1 s in its batch for company
        signalled = time.monotonic()
        running.send_signal(signal.SIGTERM)
        for client in queued:
            client.join(30)
        assert running.process.wait(30) == 0
        took = time.monotonic() - signalled
        stop.set()
        for thread in hammers:
            thread.join(30)
        assert [answers[i][0] for i in range(8)] == [200] * 8
        assert took < 25, f"exit {took:.1f} s after SIGTERM"
        statuses = {status for status in load if isinstance(status, int)}
        assert statuses <= {200, 429}, statuses
        assert "stopping" in running.lines
        assert not session_processes(running) and port_is_free(port)
    finally:
        stop.set()
        running.stop()


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130)])
def test_a_signal_to_the_group_twice_at_once_stops_it_like_one(archive, tmp_path, signum, status):
    """A terminal's Ctrl-C: every process of the group gets it, twice within a millisecond. (SIGTERM's status comes
    from the same code, `common.processes.exit_status`; SIGTERM runs in tests/inference/test_signals.py's modes.)"""
    running = local.LocalServer(archive, args=FP32, log=tmp_path / "server.log").start()
    port = running.port
    os.killpg(running.process.pid, signum)
    os.killpg(running.process.pid, signum)
    assert running.process.wait(30) == status
    assert not session_processes(running) and port_is_free(port)
    assert not any("Traceback" in line for line in running.lines), "\n".join(running.lines)


def test_sigterm_during_start_up_stops_while_the_model_loads(archive, tmp_path):
    running = local.LocalServer(archive, args=FP32, log=tmp_path / "server.log").launch()
    try:
        deadline = time.monotonic() + 60
        while not any(line.startswith("sentiment server: starting") for line in running.lines):
            assert time.monotonic() < deadline and running.process.poll() is None
            time.sleep(0.05)
        running.send_signal(signal.SIGTERM)  # it is importing torch or loading the model
        assert running.process.wait(30) == 0
        assert not any(line.startswith("serving ") for line in running.lines)
        assert not session_processes(running)
    finally:
        running.stop()


@pytest.mark.parametrize(("env", "args", "message"), [
    ({"SENTIMENT_MAX_QUEUE": "many"}, (), "SENTIMENT_MAX_QUEUE='many': not an integer"),
    ({"SENTIMENT_MAX_BATCH_SIZE": "0"}, (), "SENTIMENT_MAX_BATCH_SIZE=0: must be between 1 and 1024"),
    ({"SENTIMENT_PRECISION": "fp16"}, (), "SENTIMENT_PRECISION='fp16' is not a precision"),
    ({"SENTIMENT_DRAIN_SECONDS": "30"}, (), "SENTIMENT_DRAIN_SECONDS=30: must be between 1 and 24"),
    ({"SENTIMENT_REQUEST_TIMEOUT_MS": "20000"}, ("--drain-seconds", "10"),
     "SENTIMENT_REQUEST_TIMEOUT_MS=20000: must be below SENTIMENT_DRAIN_SECONDS (10 s = 10000 ms)"),
    ({}, ("--model-dir", "/nonexistent/model.tar.gz"), "no such file or directory"),
])
def test_bad_settings_stop_it_at_start_with_one_line(archive, env, args, message):
    command = local.LocalServer(archive, env=env).command() + list(args)
    result = subprocess.run(command, cwd=local.ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0], result.stderr
