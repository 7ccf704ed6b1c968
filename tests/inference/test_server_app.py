"""The HTTP app in-process, over ASGI, with model passes we control: a pass that breaks on one text (that request
gets a 500 with one line of JSON, the requests batched with it get their answers), a full queue (429 with the
retry hint in the body), a deadline (504), a client that leaves (its queued work is cancelled), a replica stuck in
its pass (/ping fails). The real model has none of these; the server process tests in test_server.py cover the
rest.

`call` drives the app as uvicorn does: after the body, `receive` blocks until the client disconnects (uvicorn
0.55 `protocols/http/h11_impl.py`, `RequestResponseCycle.receive`), then answers `http.disconnect`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import types

import pytest

from inference.sentiment.server.app import build_app
from inference.sentiment.server.batcher import Batcher

# Also run by tests/inference/test_python313.py under CPython 3.13, the image's Python.
pytestmark = pytest.mark.py313

LABELS = ("negative", "neutral", "positive")


class FakeTokenizer:
    """One token per word: what the app needs to count a request's tokens."""

    def __call__(self, texts, truncation=True, max_length=None):
        return {"input_ids": [[0] * len(text.split()) for text in texts]}


LOADED = types.SimpleNamespace(sentiment=types.SimpleNamespace(labels=LABELS, tokenizer=FakeTokenizer(),
                                                                max_length=512))


async def call(app, body: bytes, disconnect: asyncio.Event | None = None, method: str = "POST",
               path: str = "/invocations") -> tuple[int, dict[str, str], bytes]:
    """One request through the ASGI interface, as uvicorn would make it; `disconnect` set: the client left."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "scheme": "http", "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 1),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    sent = [{"type": "http.request", "body": body, "more_body": False}]
    disconnect = disconnect or asyncio.Event()
    messages = []

    async def receive():
        if sent:
            return sent.pop(0)
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        messages.append(message)

    await app(scope, receive, send)
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def answer(requests):
    return [[{"label": "positive", "score": 0.9}] * len(item.request.texts) for item in requests]


def test_a_request_that_breaks_the_model_pass_is_a_500_and_its_batch_neighbours_are_answered():
    gate = threading.Event()
    seen = []

    def run_batch(requests):
        seen.append([text for item in requests for text in item.request.texts])
        gate.wait(10)
        if any("poison" in item.request.texts for item in requests):
            raise RuntimeError("a tensor the model cannot take")
        return answer(requests)

    batcher = Batcher(run_batch, max_batch_size=8, max_wait_s=0.5, max_queue=64).start()
    app = build_app(LOADED, batcher)

    async def scenario():
        calls = [call(app, json.dumps({"inputs": text}).encode()) for text in ("left", "poison", "right")]
        tasks = [asyncio.ensure_future(c) for c in calls]
        while not seen:
            await asyncio.sleep(0.01)
        gate.set()
        return await asyncio.gather(*tasks)

    try:
        left, poison, right = asyncio.run(scenario())
    finally:
        batcher.stop(10)
    assert seen[0] == ["left", "poison", "right"], "the three were one batch"
    for status, headers, body in (left, right):
        assert status == 200 and json.loads(body) == [{"label": "positive", "score": 0.9}]
        assert headers["x-batch-texts"] == "1"  # answered by the run alone, after the shared pass failed
    status, headers, body = poison
    assert status == 500 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"error": "internal error", "status": 500} and body.count(b"\n") == 1


DEADLINE_S = 2.0


def test_overload_is_429_with_the_retry_hint_in_the_body_a_deadline_504_and_a_departed_clients_work_cancelled():
    gate = threading.Event()
    seen = []

    def run_batch(requests):
        seen.append([text for item in requests for text in item.request.texts])
        gate.wait(10)
        return answer(requests)

    # Two words fill the queue's tokens; the first request holds the only replica.
    batcher = Batcher(run_batch, max_batch_size=1, max_wait_s=0, max_queue=64, max_queue_tokens=2).start()
    # The deadline leaves the leaving client ample time to hang up first, even on a loaded machine (at 0.5 s a fresh
    # clone's run once saw its deadline pass before the disconnect: 504, not 499).
    app = build_app(LOADED, batcher, timeout_s=DEADLINE_S)

    async def scenario():
        held = asyncio.ensure_future(call(app, b'{"inputs": "held"}'))
        while not seen:
            await asyncio.sleep(0.01)
        left = asyncio.Event()
        leaving = asyncio.ensure_future(call(app, b'{"inputs": "two words"}', disconnect=left))
        while batcher.queued_tokens < 2:  # waits for the event (it is queued), not for a fixed time
            await asyncio.sleep(0.01)
        refused = await call(app, b'{"inputs": "one"}')  # the queue's two tokens are taken
        left.set()  # the queued client hangs up: its work leaves the queue
        gone = await leaving
        expired = await call(app, b'{"inputs": "patient"}')  # queued behind "held" past its deadline
        gate.set()
        return await held, refused, gone, expired

    try:
        held, refused, gone, expired = asyncio.run(scenario())
    finally:
        gate.set()
        batcher.stop(10)
    status, headers, body = refused
    assert status == 429 and headers["content-type"] == "application/json" and headers["retry-after"] == "1"
    error = json.loads(body)
    assert error["status"] == 429 and error["error_type"] == "overloaded" and error["retry_after_s"] == 1
    assert error["error"].startswith("overloaded: ") and body.count(b"\n") == 1
    assert gone[0] == 499 and batcher.stats.cancelled == 1
    assert expired[0] == 504 and json.loads(expired[2])["status"] == 504 and batcher.stats.expired == 1
    assert held[0] == 504  # its pass outlived the deadline too: answered 504, the late result discarded
    assert ["two", "words"] not in seen and ["patient"] not in seen, "cancelled or expired work never ran"


def test_ping_fails_once_no_replica_can_answer_and_recovers_with_its_replacement():
    release = threading.Event()
    busy = threading.Event()

    def run_batch(requests):
        busy.set()
        release.wait(10)
        return answer(requests)

    batcher = Batcher(run_batch, max_batch_size=1, max_wait_s=0, max_queue=64, stuck_after_s=0.2,
                      check_every_s=3600).start()
    app = build_app(LOADED, batcher, timeout_s=5)

    async def scenario():
        healthy = await call(app, b"", method="GET", path="/ping")
        stuck = asyncio.ensure_future(call(app, b'{"inputs": "hang"}'))
        while not busy.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        unhealthy = await call(app, b"", method="GET", path="/ping")
        batcher.check()  # the watchdog: replace the stuck replica
        deadline = time.monotonic() + 5
        while not batcher.health().healthy and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        recovered = await call(app, b"", method="GET", path="/ping")
        release.set()
        await stuck
        return healthy, unhealthy, recovered

    try:
        healthy, unhealthy, recovered = asyncio.run(scenario())
    finally:
        release.set()
        batcher.stop(10)
    assert healthy[0] == 200 and recovered[0] == 200
    status, _, body = unhealthy
    assert status == 503 and "replica 0 stuck" in json.loads(body)["error"]


def test_the_listener_says_tcp_so_asyncio_turns_nagle_off_on_each_connection():
    """asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP (base_events `_set_nodelay`); a socket
    made with proto 0 left Nagle on, and each response's body waited about 40 ms for the client's delayed ACK."""
    import socket

    from inference.sentiment.server.__main__ import bind
    from inference.sentiment.server.config import ServerConfig

    listener = bind(ServerConfig(host="127.0.0.1", port=0))

    async def scenario():
        accepted = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
            nodelay = await asyncio.wait_for(accepted, 5)
            writer.close()
            return nodelay
        finally:
            server.close()

    try:
        assert asyncio.run(scenario()) != 0
    finally:
        listener.close()
