"""The HTTP side of the SageMaker hosting contract, as a Starlette app: `GET /ping`, `POST /invocations`.

What a client sees is the contract the retired TorchServe path answered (tests/inference/test_server.py pins it):
200 with the handler's JSON, or a 4xx whose body is one line of JSON `{"error": "...", "status": N}` with
`Content-Type: application/json`, decided by the handler's own `input_fn` / `output_fn`. A body that is not
UTF-8, sent as `application/json` or `text/csv`, is a 400 before the content type is judged, as the toolkit's
path answers it. Added by this server:

- 429 when the queue is full (`batcher.Overloaded`) or the server is stopping, answered at once, with the retry
  hint in the body (`"error_type": "overloaded"`, `"retry_after_s"`; TEI answers overload 429 with an
  `error_type` too) as well as in `Retry-After`: SageMaker's InvokeEndpoint relays a container's 4xx/5xx as
  ModelError (424) carrying OriginalStatusCode and OriginalMessage (the body), and drops the headers. A 429
  counts in Invocation4XXErrors; a 503 would count in Invocation5XXErrors and roll a blue/green deploy back.
- 504 when the request's deadline (`SENTIMENT_REQUEST_TIMEOUT_MS`) passes before it is answered; work still
  queued then is dropped unrun.
- 413 for a body over SageMaker's 6 MB request limit, read no further;
- `X-Batch-Texts`: how many texts shared the request's forward pass (batching is visible to load tests).
- A client that disconnects while its request waits gets its queued work cancelled.
- `/ping` answers 503 once no replica can answer (each has died or is stuck in a forward pass past the bound).

Decoding, validation and tokenizing run on the event loop, so a bad request never reaches a batch; only valid
requests are queued, with their token counts. Anything unexpected is a 500 `internal error`; the detail goes to
the log, not to the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from http import HTTPStatus

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from inference.sentiment import inference as handler
from inference.sentiment.server import model as models
from inference.sentiment.server.batcher import Batcher, DeadlineExceeded, Overloaded, Stopped

LOG = logging.getLogger(__name__)
JSON = "application/json"
# SageMaker real-time endpoints accept at most 6 MB per request.
MAX_BODY_BYTES = 6 * 1024 * 1024
# The types the SageMaker toolkit decodes as UTF-8 before the handler sees them (sagemaker_inference
# content_types.UTF8_TYPES); a body that is not UTF-8 is a 400 for them whatever the handler would say.
UTF8_TYPES = ("application/json", "text/csv")
RETRY_AFTER_S = 1


def overloaded_response(message: str) -> Response:
    """429 with the retry hint in the body, where SageMaker's OriginalMessage keeps it."""
    body = json.dumps({"error": message, "status": 429, "error_type": "overloaded", "retry_after_s": RETRY_AFTER_S},
                      ensure_ascii=True) + "\n"
    return Response(body, status_code=429, media_type=JSON, headers={"Retry-After": str(RETRY_AFTER_S)})


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps({"error": message, "status": status}, ensure_ascii=True) + "\n"
    return Response(body, status_code=status, media_type=JSON, headers=headers)


def _client_error(error: handler.ClientError) -> Response:
    return error_response(error.status_code, error.error)


async def _read_body(request: Request) -> bytes | None:
    """The body, or None once it passes MAX_BODY_BYTES (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _utf8_error(body: bytes, content_type: str | None) -> Response | None:
    media = (content_type or "").split(";")[0].strip().lower()
    if media not in UTF8_TYPES:
        return None
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as error:
        return error_response(400, f"request body is not valid UTF-8 (byte {error.start}); "
                                   f"{media} bodies must be UTF-8")
    return None


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone: after the body, uvicorn's `receive` blocks until the connection is lost
    (or the response is complete) and then gives `http.disconnect` (uvicorn h11_impl `RequestResponseCycle`)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(loaded: models.LoadedModel, batcher: Batcher, *, timeout_s: float | None = None) -> Starlette:
    """The app: the model is loaded and the batcher started before the first request. `timeout_s`: each
    request's deadline from its arrival (None: the batcher's own)."""
    timeout_s = batcher.timeout_s if timeout_s is None else timeout_s

    async def ping(request: Request) -> Response:
        health = batcher.health()
        if not health.healthy:
            return error_response(503, f"unhealthy: {health.detail}")
        return Response(b'{"status": "healthy"}\n', media_type=JSON)

    async def invocations(request: Request) -> Response:
        arrived = time.monotonic()
        try:
            body = await _read_body(request)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is listening any more
        if body is None:
            return error_response(413, f"request body over {MAX_BODY_BYTES} bytes")
        content_type = request.headers.get("content-type")
        accept = request.headers.get("accept")
        if (bad := _utf8_error(body, content_type)) is not None:
            return bad
        try:
            parsed = handler.input_fn(body, content_type)
            handler.output_fn([], accept)  # 406 before the work, not after it
            models.check_top_k(parsed, loaded)
            item = models.encode(parsed, loaded)
        except handler.ClientError as error:
            return _client_error(error)
        deadline = arrived + timeout_s if timeout_s is not None else None
        try:
            future = batcher.submit(item, len(parsed.texts), item.tokens, deadline)
        except Overloaded as error:
            return overloaded_response(f"overloaded: {error}; retry in {RETRY_AFTER_S} s")
        except Stopped:
            return overloaded_response(f"the server is stopping; retry in {RETRY_AFTER_S} s")
        answer = asyncio.wrap_future(future)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = await asyncio.wait({answer, gone}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if answer not in done:
            batcher.cancel(future, expired=gone not in done)  # queued: dropped unrun; running: answer discarded
            answer.cancel()
            if gone in done:
                return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
            return error_response(504, f"no answer within the request deadline ({timeout_s:g} s)")
        try:
            outcome = answer.result()
        except DeadlineExceeded as error:
            return error_response(504, f"deadline passed before the request ran: {error}")
        except handler.ClientError as error:
            return _client_error(error)
        except Exception:
            LOG.exception("request failed")
            return error_response(500, "internal error")
        answer_body, media = handler.output_fn(outcome.result, accept)
        return Response(answer_body, media_type=media, headers={"X-Batch-Texts": str(outcome.batch_texts)})

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(404, f"no route {request.method} {request.url.path}; try GET /ping or "
                                   "POST /invocations")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(405, f"{request.method} is not allowed on {request.url.path}")

    async def internal(request: Request, exc: Exception) -> Response:
        LOG.error("unhandled %s: %s", type(exc).__name__, exc)
        return error_response(500, HTTPStatus(500).phrase.lower())

    return Starlette(
        routes=[Route("/ping", ping, methods=["GET"]), Route("/invocations", invocations, methods=["POST"])],
        exception_handlers={404: not_found, 405: not_allowed, 500: internal},
    )
