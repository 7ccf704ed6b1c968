"""The HTTP side of the SageMaker hosting contract, as a Starlette app: `GET /ping`, `POST /invocations`.

What a client sees is today's contract (the TorchServe path's; tests/inference/test_local_stack.py pins it):
200 with the handler's JSON, or a 4xx whose body is one line of JSON `{"error": "...", "status": N}` with
`Content-Type: application/json`, decided by the handler's own `input_fn` / `output_fn`. A body that is not
UTF-8, sent as `application/json` or `text/csv`, is a 400 before the content type is judged, as the toolkit's
path answers it. Added by this server:

- 503 with `Retry-After: 1` when the worker's queue is full (`batcher.Overloaded`), answered at once;
- 413 for a body over SageMaker's 6 MB request limit, read no further;
- `X-Batch-Texts`: how many texts shared the request's forward pass (batching is visible to load tests).

Decoding and validation run on the event loop, so a bad request never reaches a batch; only valid requests are
queued. Anything unexpected is a 500 `internal error`; the detail goes to the log, not to the client.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from http import HTTPStatus

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from inference.sentiment import inference as handler
from inference.sentiment.server import model as models
from inference.sentiment.server.batcher import Batcher, Overloaded, Stopped

LOG = logging.getLogger(__name__)
JSON = "application/json"
# SageMaker real-time endpoints accept at most 6 MB per request.
MAX_BODY_BYTES = 6 * 1024 * 1024
# The types the SageMaker toolkit decodes as UTF-8 before the handler sees them (sagemaker_inference
# content_types.UTF8_TYPES); a body that is not UTF-8 is a 400 for them whatever the handler would say.
UTF8_TYPES = ("application/json", "text/csv")


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


def build_app(loaded: models.LoadedModel, batcher: Batcher) -> Starlette:
    """The app for one worker: the model is loaded and the batcher started before the first request."""

    async def ping(request: Request) -> Response:
        return Response(b'{"status": "healthy"}\n', media_type=JSON)

    async def invocations(request: Request) -> Response:
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
        except handler.ClientError as error:
            return _client_error(error)
        try:
            outcome = await batcher.run(parsed, len(parsed.texts))
        except Overloaded as error:
            return error_response(503, f"overloaded: {error}; retry later", {"Retry-After": "1"})
        except Stopped:
            return error_response(503, "the server is stopping; retry on another instance", {"Retry-After": "1"})
        except handler.ClientError as error:
            return _client_error(error)
        except Exception:
            LOG.exception("request failed")
            return error_response(500, "internal error")
        answer, media = handler.output_fn(outcome.result, accept)
        return Response(answer, media_type=media, headers={"X-Batch-Texts": str(outcome.batch_texts)})

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(404, f"no route {request.method} {request.url.path}; try GET /ping or "
                                   "POST /invocations")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(405, f"{request.method} is not allowed on {request.url.path}")

    async def internal(request: Request, exc: Exception) -> Response:
        LOG.error("unhandled %s: %s", type(exc).__name__, exc)
        return error_response(500, HTTPStatus(500).phrase.lower())

    @asynccontextmanager
    async def lifespan(app):
        yield
        batcher.stop(timeout=60)  # after uvicorn has answered every request it accepted

    return Starlette(
        routes=[Route("/ping", ping, methods=["GET"]), Route("/invocations", invocations, methods=["POST"])],
        exception_handlers={404: not_found, 405: not_allowed, 500: internal},
        lifespan=lifespan,
    )
