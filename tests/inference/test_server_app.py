"""The HTTP app in-process, over ASGI, with a model pass that breaks on one text: that request gets a 500 with
one line of JSON, the requests batched with it get their answers. (The real model has no such text; the server
process tests in test_server.py cover everything else.)
"""

from __future__ import annotations

import asyncio
import json
import threading
import types

from inference.sentiment.server.app import build_app
from inference.sentiment.server.batcher import Batcher

LABELS = ("negative", "neutral", "positive")


async def call(app, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """One POST /invocations through the ASGI interface, as uvicorn would make it."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "path": "/invocations", "raw_path": b"/invocations", "query_string": b"", "root_path": "",
             "scheme": "http", "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 1),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    sent = [{"type": "http.request", "body": body, "more_body": False}]
    messages = []

    async def receive():
        return sent.pop(0) if sent else {"type": "http.disconnect"}

    async def send(message):
        messages.append(message)

    await app(scope, receive, send)
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def test_a_request_that_breaks_the_model_pass_is_a_500_and_its_batch_neighbours_are_answered():
    gate = threading.Event()
    seen = []

    def run_batch(requests):
        seen.append([text for request in requests for text in request.texts])
        gate.wait(10)
        if any("poison" in request.texts for request in requests):
            raise RuntimeError("a tensor the model cannot take")
        return [[{"label": "positive", "score": 0.9}] * len(request.texts) for request in requests]

    batcher = Batcher(run_batch, max_batch_size=8, max_wait_s=0.5, max_queue=64).start()
    loaded = types.SimpleNamespace(sentiment=types.SimpleNamespace(labels=LABELS))
    app = build_app(loaded, batcher)

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
