"""The local server: the container's HTTP contract on an ephemeral port, from a model.tar.gz."""

from __future__ import annotations

import http.client
import json
import threading

import pytest

from inference.sentiment import serve

GOOD = json.dumps({"inputs": ["lovely weather", "terrible service"]}).encode()


@pytest.fixture(scope="module")
def server(archive):
    """`make_server` on the packaged archive (extracted to a temporary folder), served from a thread."""
    running = serve.make_server(archive, "127.0.0.1", 0)
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()
    thread.join(timeout=5)


def request(server, method, path, body=None, headers=None, connection=None):
    """(status, headers, body) of one request; pass `connection` to reuse a keep-alive connection."""
    own = connection is None
    connection = connection or http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        if own:
            connection.close()


def test_loads_the_handler_shipped_in_the_archive(server):
    assert server.handler.module.__file__.endswith("code/inference.py")
    assert server.handler.model_dir != serve.Path(".")


def test_ping(server):
    status, _, body = request(server, "GET", "/ping")
    assert status == 200 and json.loads(body) == {"status": "healthy"}


def test_invocations_answers_and_keeps_the_connection_alive(server):
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    try:
        for _ in range(2):
            status, headers, body = request(server, "POST", "/invocations", GOOD,
                                            {"Content-Type": "application/json"}, connection)
            assert status == 200 and headers["Content-Type"] == "application/json"
            assert [set(result) for result in json.loads(body)] == [{"label", "score"}] * 2
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (GOOD, {"Content-Type": "text/plain"}, 415),
        (b"{not json", {"Content-Type": "application/json"}, 400),
        (b'{"inputs": []}', {"Content-Type": "application/json"}, 400),
        (json.dumps({"inputs": ["a"] * 65}).encode(), {"Content-Type": "application/json"}, 413),
        (b'{"inputs": "a", "parameters": {"top_k": false}}', {"Content-Type": "application/json"}, 400),
        (GOOD, {"Content-Type": "application/json", "Accept": "text/csv"}, 406),
        # Through the toolkit's request path, which decodes these two types before input_fn: still 400.
        (b'{"inputs": "caf\xe9"}', {"Content-Type": "application/json"}, 400),
        (b'{"inputs": "caf\xe9"}', {"Content-Type": "text/csv"}, 400),
    ],
)
def test_client_errors_keep_their_status_and_the_server_keeps_serving(server, body, headers, status):
    got, response_headers, response = request(server, "POST", "/invocations", body, headers)
    assert got == status
    assert response_headers["Content-Type"] == "application/json"
    assert json.loads(response)["status"] == status and response.count(b"\n") == 1
    assert request(server, "POST", "/invocations", GOOD, {"Content-Type": "application/json"})[0] == 200


def test_unknown_routes_and_oversized_bodies(server, monkeypatch):
    assert request(server, "GET", "/nope")[0] == 404
    assert request(server, "POST", "/predict", GOOD)[0] == 404
    monkeypatch.setattr(serve, "MAX_BODY_BYTES", 10)
    assert request(server, "POST", "/invocations", GOOD, {"Content-Type": "application/json"})[0] == 413


def test_unexpected_exception_is_a_500_and_the_server_survives(server, monkeypatch):
    def broken(data, model):
        raise RuntimeError("boom")

    monkeypatch.setattr(server.handler.module, "predict_fn", broken)
    status, _, body = request(server, "POST", "/invocations", GOOD, {"Content-Type": "application/json"})
    assert status == 500 and json.loads(body) == {"error": "internal error", "status": 500}
    monkeypatch.undo()
    assert request(server, "POST", "/invocations", GOOD, {"Content-Type": "application/json"})[0] == 200


def test_model_dir_without_code_uses_the_repository_handler(model_dir):
    handler = serve.Handler(model_dir)
    try:
        assert handler.module.__name__ == "inference.sentiment.inference"
        status, body, content_type = handler.invoke(GOOD, "application/json", None)
        assert (status, content_type) == (200, "application/json") and len(json.loads(body)) == 2
    finally:
        handler.close()


def test_archive_is_extracted_and_cleaned_up(archive):
    path, workdir = serve.resolve_model_dir(archive)
    assert (path / "config.json").is_file() and (path / "code" / "inference.py").is_file()
    workdir.cleanup()
    assert not path.exists()


@pytest.mark.parametrize("kind", ["missing", "empty dir", "not a tar"])
def test_bad_model_dir_exits_2(tmp_path, capsys, kind):
    target = tmp_path / "model"
    if kind == "empty dir":
        target.mkdir()
    elif kind == "not a tar":
        target.write_text("hello")
    assert serve.main(["--model-dir", str(target), "--port", "0"]) == 2
    assert "error: --model-dir" in capsys.readouterr().err


# How `python -m inference.sentiment.serve` stops on SIGTERM and SIGINT: tests/inference/test_signals.py.
