"""A loopback stand-in for LMI (DJL Serving) and for SageMaker's runtime in front of it, for tests without AWS.

`FakeLmi(mode, version=...)` listens on 127.0.0.1 and answers `POST /invocations` with the bytes the container of
that version sends in that mode, built here rule by rule from DJL Serving's source (never copied; read at
github.com/deepjavalibrary/djl-serving, paths under `engines/python/setup/djl_python/` unless a Java file is named):

| version | branch | commit |
|---|---|---|
| 0.23.0 | 0.23.0-dlc | 07673c54097d8a51bf6e526d3268b7d19e8b5425 (djl api v0.23.0 bae9212b) |
| 0.33.0 | 0.33.0-dlc | 8b3b685b65f0ba1d89ce471c0f1cefc09dc36da2 (djl api v0.34.0 8799a1b4) |
| 0.35.0 | 0.35.0-dlc | 637866135ee775bc1533808e843d7c32c8a2c179 (djl api v0.35.0) |
| 0.36.0-lmi27 | 0.36.0-lmi27-dlc | 7e13b081383bd46293d4b49ab214d4757b1effd5 (djl api v0.36.0 1a7265a7) |

DJL Serving's public source has no branch for 0.36.0-lmi28 or 0.38.0-lmi29 (the snapshot ends at 0.36.0-lmi27-dlc),
so they are not modelled; version names are inference.llm.lmi's `lmi_version` values.
The rule behind each byte is beside the function that builds it. Modes are the project's (inference.llm.lmi
.versions): `dynamic` (huggingface.py, transformers pipeline, batch_size > 1) and `rolling` (0.23: lmi-dist under
rolling_batch.py; 0.33+: lmi_vllm/vllm_async_service.py). Batching is simulated: dynamic gathers up to
`batch_size` requests for `max_batch_delay_s`, rolling decodes up to `max_rolling` requests one token per step.

Failures, each the way DJL reports it: `fail_next` (the handler fails before answering: a non-200 status),
`fail_streams` (the engine fails after the 200: DJL's record appended to the body; `djl_pretty_print=True`, 0.33+
only, is the container's DJL_PRETTY_PRINT=true, which makes Gson write that record over several lines).
`merge=k` makes vLLM merge k tokens per line, as it does when the reader falls behind. SageMaker's own stream
errors (ModelStreamError with ModelInvocationTimeExceeded or StreamBroken) come only from
`sagemaker_runtime(..., stream_errors=[...])`.

As a process, for trying a client against it or checking how it stops (tests/inference/test_signals.py):

    python -m tests.fake_lmi --mode rolling --port 8081

It prints `listening on http://127.0.0.1:PORT/invocations` once it answers, and stops on SIGTERM (exit 0) or Ctrl-C
(exit 130), to the process or its group, once or repeated (`common.processes`).
"""

from __future__ import annotations

import argparse
import binascii
import http.client
import json
import os
import queue
import random
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_DONE = object()
ANSWER_WAIT_S = 10.0  # the most a handler waits for the scheduler's next token before giving up
VERSIONS = ("0.23.0", "0.33.0", "0.35.0", "0.36.0-lmi27")
SOURCES = {"0.23.0": ("0.23.0-dlc", "07673c54097d8a51bf6e526d3268b7d19e8b5425"),
           "0.33.0": ("0.33.0-dlc", "8b3b685b65f0ba1d89ce471c0f1cefc09dc36da2"),
           "0.35.0": ("0.35.0-dlc", "637866135ee775bc1533808e843d7c32c8a2c179"),
           "0.36.0-lmi27": ("0.36.0-lmi27-dlc", "7e13b081383bd46293d4b49ab214d4757b1effd5")}
# Token texts: one word each (so a whitespace count equals the token count), several with multi-byte UTF-8, so a
# PayloadPart cut can fall inside a character. Ids are what a tokenizer would give; only their presence matters.
VOCABULARY = (" Grüße", " naïve", " 東京", " ok", " €5", " 🚀", " the", " déjà")
TOKEN_ID_BASE = 1000
LOGPROB = -0.5


def token(number: int) -> tuple[int, str]:
    """(id, text) of the number-th generated token (1-based)."""
    index = (number - 1) % len(VOCABULARY)
    return TOKEN_ID_BASE + index, VOCABULARY[index]


def generated(count: int) -> str:
    return "".join(token(number)[1] for number in range(1, count + 1))


def vllm_era(version: str) -> bool:
    return version != "0.23.0"


# --- bytes, rule by rule ------------------------------------------------------------------------------------

def python_json(value) -> bytes:
    """outputs.py Output._encode_json (all four branches): what Output.add_as_json writes, pretty-printed."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=2, separators=(",", ":")).encode()


def dynamic_answer(prompt: str, text: str) -> bytes:
    """Dynamic batching, every version: huggingface.py wraps the text-generation pipeline so it decodes the whole
    sequence (prompt included) into `[{"generated_text": ...}]`, and `encode_decode.py` encode() adds it with
    add_as_json for any Accept containing "application/json" (application/jsonlines too). `"stream"` is ignored."""
    return python_json([{"generated_text": prompt + text}])


def handler_error(version: str, error: str) -> bytes:
    """A handler that raises: the Python engine answers Output().error(str(e)) (0.23 djl_python_engine.py,
    0.33+ python_sync_engine.py / python_async_engine.py), code 424, body pretty-printed by outputs.py."""
    message = "prediction failure" if version == "0.23.0" else "invoke handler failure"
    return python_json({"code": 424, "message": message, "error": error})


_GSON_HTML_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "=": "\\u003d", "'": "\\u0027"}


def gson(value, pretty: bool = False) -> bytes:
    """What a default Gson writes (djl's JsonUtils.builder()): non-ASCII kept, HTML characters escaped
    (GsonBuilder's default), compact; with setPrettyPrinting (djl v0.24.0+ when DJL_PRETTY_PRINT=true, api
    JsonUtils.java) one member a line, indented by two spaces, `"key": value`, empty containers as {} and []."""
    text = json.dumps(value, ensure_ascii=False, indent=2 if pretty else None,
                      separators=(",", ": ") if pretty else (",", ":"))
    return "".join(_GSON_HTML_ESCAPES.get(char, char) for char in text).encode()


def gson_output_record(version: str, code: int, message: str, pretty: bool = False) -> bytes:
    """Gson of ai.djl.modality.Output(code, message): Output's fields, then Input's; djl v0.34+ adds `cancelled`.
    Compact at djl v0.23.0 (bae9212b: `GSON = new GsonBuilder().create()`); from v0.24.0 pretty-printed when the
    container sets DJL_PRETTY_PRINT=true (`pretty`)."""
    if pretty and not vllm_era(version):
        raise ValueError("djl v0.23.0's JsonUtils.GSON never pretty-prints (DJL_PRETTY_PRINT arrived in v0.24.0)")
    record = {"code": code, "message": message, "properties": {}, "content": {"keys": [], "values": []}}
    if vllm_era(version):
        record["cancelled"] = False
    return gson(record, pretty)


def engine_failure(version: str, pretty: bool = False) -> bytes:
    """The engine dying after the 200, appended with no newline after what was already sent.

    0.33+: AsyncRequestManager.java terminateInFlightRequests appends Gson of Output(500, "Inference Engine
    Failure") to every active request. 0.23 (0.23.0-dlc 07673c54): rolling_batch.py stop_on_any_exception resets
    the batch and returns postprocess_results(0), an empty list; huggingface.py inference then reads result[idx]
    for each request of the batch (IndexError); djl_python_engine.py answers Output().error(str(e)), code 424; and
    RollingBatch.java run, seeing code != 200, appends Gson of Output(424, "Batch inference failed") to every
    request and ends it."""
    if vllm_era(version):
        return gson_output_record(version, 500, "Inference Engine Failure", pretty)
    return gson_output_record(version, 424, "Batch inference failed", pretty)


def request_error(error: str, code: int = 424) -> bytes:
    """0.33+ Request.java addResponse: a chunk with `code` becomes Gson of a ConcurrentHashMap {code, error}; with
    two entries the table has 4 buckets and "error" (bucket 0) iterates before "code" (bucket 3)."""
    return json.dumps({"error": error, "code": code}, separators=(",", ":"), ensure_ascii=False).encode()


def vllm_line(tokens: list[tuple[int, str]], history: list[str], finished: bool,
              details: tuple[int, int] | None = None) -> bytes:
    """0.33+ lmi_vllm/request_response_utils.py convert_completion_chunk_response_to_lmi_schema: one vLLM
    completion chunk, whose text may hold several tokens (vLLM merges outputs when the reader is behind) but whose
    `logprobs.tokens[0]` is the only id kept. async_utils.py _create_output adds the newline.

    `details` = (vLLM's usage.completion_tokens, usage.prompt_tokens) when the request asked `"details": true`
    (lmi_with_details_stream_output_formatter): the last line then carries finish_reason, seed (the request's,
    None unless sent), generated_tokens = completion_tokens + 1 (DJL's formula) and input_length. vLLM's continuous
    usage on that line is the running total including it (serving_completion.py completion_stream_generator)."""
    text = "".join(piece for _id, piece in tokens)
    history.append(text)
    chunk = {"index": 0, "token": {"id": tokens[0][0], "text": text, "logprob": LOGPROB},
             "generated_text": "".join(history) if finished else None, "details": None}
    if finished and details is not None:
        completion_tokens, prompt_tokens = details
        chunk["details"] = {"finish_reason": "length", "seed": None, "generated_tokens": completion_tokens + 1,
                            "input_length": prompt_tokens}
    return json.dumps(chunk, ensure_ascii=False).encode() + b"\n"


# After the last token: vLLM's usage-only chunk (LMI asks include_usage) formats to "" and "[DONE]" to "" (last);
# _create_output appends "\n" to both and Request.java appends any non-empty data.
VLLM_STREAM_END = b"\n\n"


def vllm_whole(text: str, tokens: list[tuple[int, str]] | None = None) -> bytes:
    """0.33+ non-streamed LMI request: convert_completion_response_to_lmi_schema -> create_non_stream_output. With
    `tokens` (the request asked `"details": true`): details with finish_reason = the choice's stop_reason (None
    when the length limit ended it), generated_tokens = vLLM's usage.completion_tokens, seed, prefill and the
    tokens (convert_completion_logprobs_to_tgi_tokens: id, decoded text, logprob)."""
    answer: dict = {"generated_text": text}
    if tokens is not None:
        answer["details"] = {"finish_reason": None, "generated_tokens": len(tokens), "seed": None, "prefill": [],
                             "tokens": [{"id": id_, "text": piece, "logprob": LOGPROB} for id_, piece in tokens]}
    return json.dumps(answer, ensure_ascii=False).encode() + b"\n"


def chat_chunk(content: str | None, finish_reason: str | None, role: bool = False) -> bytes:
    """0.33+ chat stream: vllm_stream_output_formatter strips vLLM's `data: ` and passes its chat.completion.chunk
    through (fields as in DJL's serving/docs/lmi/user_guides/chat_input_output_schema.md); newline added."""
    delta = {"role": "assistant", "content": ""} if role else {"content": content}
    chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake",
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    return json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def chat_whole(text: str, prompt_tokens: int, completion_tokens: int) -> bytes:
    """0.33+ chat without stream: vllm_non_stream_output_formatter, ChatCompletionResponse.model_dump_json()."""
    answer = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                           "finish_reason": "length"}],
              "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                        "completion_tokens": completion_tokens}}
    return json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def lmi_dist_json_piece(text: str, first: bool, last: bool) -> bytes:
    """0.23 rolling_batch.py _json_output_formatter (option.output_formatter=json, the default): the chunks form
    one document; each token's text is json.dumps-escaped (ASCII) without its quotes."""
    piece = ('{"generated_text": "' if first else "") + json.dumps(text)[1:-1] + ('"}' if last else "")
    return piece.encode()


def lmi_dist_jsonlines(text: str) -> bytes:
    """0.23 rolling_batch.py _jsonlines_output_formatter (option.output_formatter=jsonlines)."""
    return (json.dumps({"outputs": [text]}) + "\n").encode()


# --- the server ---------------------------------------------------------------------------------------------

_STREAMED = ("lmi-dist-json", "lmi-dist-jsonlines", "vllm-stream", "chat-stream")


def _form(server: FakeLmi, payload: dict) -> str:
    """Which of LMI's answer forms a request gets. 0.23 lmi-dist sends every answer in chunks, whatever the request
    (RollingBatch.java ChunkedBytesSupplier); 0.33+ vLLM streams only with `"stream": true`; dynamic never."""
    if server.mode == "dynamic":
        return "dynamic"
    if not vllm_era(server.version):
        return f"lmi-dist-{server.output_formatter}"
    kind = "chat" if "messages" in payload else "vllm"
    return f"{kind}-stream" if payload.get("stream") is True else f"{kind}-whole"


@dataclass
class _Request:
    max_new_tokens: int
    details: bool = False  # `"details": true` on 0.33+ vLLM (lmi_vllm pops it; other modes are not modelled)
    prompt_tokens: int = 0  # the fake's tokenizer: one token per whitespace word
    tokens: queue.Queue = field(default_factory=queue.Queue)
    produced: int = 0
    fail_after: int | None = None


class FakeLmi(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str = "rolling", *, version: str = "0.36.0-lmi27", output_formatter: str = "json",
                 batch_size: int = 4, max_batch_delay_s: float = 0.01, max_rolling: int = 8,
                 prefill_s: float = 0.005, token_s: float = 0.002, merge: int = 1, djl_pretty_print: bool = False,
                 port: int = 0):
        if mode not in ("dynamic", "rolling"):
            raise ValueError(f"mode {mode!r}: dynamic or rolling")
        if version not in VERSIONS:
            raise ValueError(f"version {version!r}: one of {', '.join(VERSIONS)} (no public DJL source for others)")
        if output_formatter not in ("json", "jsonlines"):
            raise ValueError(f"output_formatter {output_formatter!r}: json or jsonlines (0.23 rolling only)")
        if merge < 1 or (merge > 1 and (mode != "rolling" or not vllm_era(version))):
            raise ValueError(f"merge {merge}: vLLM merges outputs; use 1 outside rolling on 0.33+")
        if djl_pretty_print and not vllm_era(version):
            raise ValueError("djl_pretty_print: djl v0.23.0's Gson never pretty-prints (DJL_PRETTY_PRINT is v0.24+)")
        self.mode, self.version, self.output_formatter, self.merge = mode, version, output_formatter, merge
        self.djl_pretty_print = djl_pretty_print  # the container's DJL_PRETTY_PRINT=true (Gson records span lines)
        self.batch_size, self.max_batch_delay_s = batch_size, max_batch_delay_s
        self.max_rolling, self.prefill_s, self.token_s = max_rolling, prefill_s, token_s
        self.payloads: list[dict | None] = []
        self.batches: list[int] = []  # dynamic: requests per batch; rolling: requests decoding per token step
        self._failures: list[str] = []  # handler errors for the next requests, in order
        self._stream_failures: list[int] = []  # the next requests' engine fails after this many tokens
        self._waiting: list[_Request] = []
        self._lock = threading.Condition()
        self._stopped = threading.Event()
        super().__init__(("127.0.0.1", port), _Handler)
        self._workers = [threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True),
                         threading.Thread(target=self._schedule, daemon=True)]

    # -- control
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/invocations"

    def fail_next(self, count: int = 1, error: str = "CUDA out of memory") -> None:
        """The handler of the next `count` requests raises `error` before answering."""
        with self._lock:
            self._failures += [error] * count

    def fail_streams(self, count: int = 1, after: int = 1) -> None:
        """The engine fails after `after` tokens of each of the next `count` requests (after the 200)."""
        with self._lock:
            self._stream_failures += [after] * count

    def __enter__(self) -> FakeLmi:
        for thread in self._workers:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()
        with self._lock:
            self._lock.notify_all()
        self.shutdown()
        self.server_close()
        for thread in self._workers:
            thread.join(timeout=5)

    # -- the engine
    def submit(self, payload: dict | None) -> tuple[str | None, _Request | None]:
        """(handler error, queued request): one of them."""
        with self._lock:
            self.payloads.append(payload)
            if self._failures:
                return self._failures.pop(0), None
            if not isinstance(payload, dict):
                return "Invalid request payload: not a JSON object", None
            if "messages" in payload:
                if self.mode != "rolling" or not vllm_era(self.version):
                    return "fake_lmi models chat only for LMI's vLLM service (0.33+ rolling)", None
                count = payload.get("max_tokens") or 16
            elif isinstance(payload.get("inputs"), str):
                count = (payload.get("parameters") or {}).get("max_new_tokens", 30)  # LMI's default is 30
            else:
                return "Invalid request payload: 'inputs' must be a string", None
            parameters = payload.get("parameters") if isinstance(payload.get("parameters"), dict) else {}
            details = parameters.get("details") is True and self.mode == "rolling" and vllm_era(self.version) \
                and "messages" not in payload
            request = _Request(int(count), details, len(str(payload.get("inputs", "")).split()))
            if self._stream_failures:
                request.fail_after = self._stream_failures.pop(0)
            self._waiting.append(request)
            self._lock.notify_all()
        return None, request

    def _take(self, limit: int, wait_s: float) -> list[_Request]:
        with self._lock:
            deadline = time.monotonic() + wait_s
            while len(self._waiting) < limit and not self._stopped.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            taken, self._waiting = self._waiting[:limit], self._waiting[limit:]
            return taken

    def _schedule(self) -> None:
        active: list[_Request] = []
        while not self._stopped.is_set():
            if self.mode == "dynamic":
                first = self._take(1, 0.05)
                if not first:
                    continue
                batch = first + self._take(self.batch_size - 1, self.max_batch_delay_s)
                self.batches.append(len(batch))
                time.sleep(self.prefill_s + self.token_s * max(request.max_new_tokens for request in batch))
                for request in batch:
                    for _ in range(min(request.max_new_tokens, request.fail_after or request.max_new_tokens)):
                        self._emit(request)
                    request.tokens.put(_DONE)
                continue
            joined = self._take(self.max_rolling - len(active), 0.05 if not active else 0)
            if joined:
                time.sleep(self.prefill_s)  # prefill of the newcomers holds up the whole batch, as in LMI
                active += joined
            if not active:
                continue
            time.sleep(self.token_s)
            self.batches.append(len(active))
            for request in active:
                self._emit(request)
                if request.produced >= request.max_new_tokens or request.fail_after == request.produced:
                    request.tokens.put(_DONE)
            active = [r for r in active if r.produced < r.max_new_tokens and r.fail_after != r.produced]

    @staticmethod
    def _emit(request: _Request) -> None:
        request.produced += 1
        request.tokens.put(token(request.produced))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: FakeLmi

    def do_GET(self):
        self._send(200 if self.path == "/ping" else 404, b'{"status": "Healthy"}\n')

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        server = self.server
        error, request = server.submit(payload)
        if request is None:
            if vllm_era(server.version) and server.mode == "rolling":
                # vllm_async_service.py: a failure before inference is create_non_stream_output("", error, 424);
                # Request.java sets the status from its code before anything was sent.
                self._send(424, request_error(error))
            else:
                self._send(424, handler_error(server.version, error))
            return
        form = _form(server, payload)
        if form in _STREAMED:
            self.send_response(200)
            self.send_header("Content-Type", "application/json" if form == "lmi-dist-json" else "application/jsonlines")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
        pending: list[tuple[int, str]] = []
        history: list[str] = []
        texts: list[str] = []
        tokens: list[tuple[int, str]] = []
        while True:
            try:
                item = request.tokens.get(timeout=ANSWER_WAIT_S)
            except queue.Empty:
                self.close_connection = True
                return
            if item is _DONE:
                break
            texts.append(item[1])
            tokens.append(item)
            last = len(texts) == request.max_new_tokens
            if form not in _STREAMED:
                continue
            if form == "lmi-dist-json":
                self._chunk(lmi_dist_json_piece(item[1], len(texts) == 1, last))
            elif form == "lmi-dist-jsonlines":
                self._chunk(lmi_dist_jsonlines(item[1]))
            else:  # vLLM: merge `merge` tokens per line, as vLLM does for a reader that is behind
                if form == "chat-stream" and len(texts) == 1:
                    self._chunk(chat_chunk(None, None, role=True))
                pending.append(item)
                if len(pending) == server.merge or last:
                    if form == "vllm-stream":
                        self._chunk(vllm_line(pending, history, last,
                                              (len(texts), request.prompt_tokens) if request.details else None))
                    else:
                        self._chunk(chat_chunk("".join(text for _id, text in pending), "length" if last else None))
                    pending = []
        failed = request.fail_after is not None and len(texts) == request.fail_after < request.max_new_tokens
        text = "".join(texts)
        if form in _STREAMED:
            if failed:
                self._chunk(engine_failure(server.version, server.djl_pretty_print))
            elif form in ("vllm-stream", "chat-stream"):
                self._chunk(VLLM_STREAM_END if form == "vllm-stream" else b"\n")  # chat: "[DONE]" -> "\n"
            self._chunk(b"")
        elif failed:  # nothing was sent yet: the handler's error, with its status
            if form == "dynamic":
                self._send(424, handler_error(server.version, "engine failed"))
            else:
                self._send(500, engine_failure(server.version, server.djl_pretty_print))
        elif form == "dynamic":
            self._send(200, dynamic_answer(payload["inputs"], text))
        elif form == "chat-whole":
            self._send(200, chat_whole(text, 8, len(texts)))
        else:
            self._send(200, vllm_whole(text, tokens if request.details else None))

    def _chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _send(self, status: int, data: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def log_message(self, format, *args):
        pass


# --- SageMaker's runtime in front of the fake container -----------------------------------------------------
# InvokeEndpointWithResponseStream relays the container's bytes as PayloadPart events. Where SageMaker cuts them
# is not documented, so the cuts here are random (seeded): inside JSON lines and inside UTF-8 characters. Its own
# errors are ModelStreamError with ErrorCode ModelInvocationTimeExceeded or StreamBroken (the API reference); DJL's
# errors are never turned into them. A container that answers non-200 before streaming is a ModelError (424).
SAGEMAKER_STREAM_ERRORS = ("ModelInvocationTimeExceeded", "StreamBroken")


def event_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message (prelude, string headers, payload, CRC32s), as botocore decodes it."""
    encoded = b"".join(bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(value)) + value.encode()
                       for name, value in headers.items())
    prelude = struct.pack(">II", 16 + len(encoded) + len(payload), len(encoded))
    message = prelude + struct.pack(">I", binascii.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", binascii.crc32(message))


def payload_part(data: bytes) -> bytes:
    return event_message({":event-type": "PayloadPart", ":message-type": "event",
                          ":content-type": "application/octet-stream"}, data)


def model_stream_error(error_code: str, message: str = "") -> bytes:
    if error_code not in SAGEMAKER_STREAM_ERRORS:
        raise ValueError(f"error_code {error_code!r}: SageMaker raises ModelStreamError only with "
                         f"{' or '.join(SAGEMAKER_STREAM_ERRORS)}")
    return event_message({":exception-type": "ModelStreamError", ":message-type": "exception",
                          ":content-type": "application/json"},
                         json.dumps({"Message": message or error_code, "ErrorCode": error_code}).encode())


def random_cuts(data: bytes, rng: random.Random, largest: int = 23) -> list[bytes]:
    """`data` in pieces of 1..largest bytes: cuts anywhere, inside lines and characters."""
    pieces, start = [], 0
    while start < len(data):
        size = rng.randint(1, largest)
        pieces.append(data[start:start + size])
        start += size
    return pieces


def event_stream(data_pieces, rng: random.Random, error_code: str | None = None):
    """Event-stream bytes for PayloadParts of `data_pieces`, delivered to botocore in random slices too; a
    SageMaker stream error after the first part when `error_code` is given."""
    for number, piece in enumerate(data_pieces):
        if error_code and number == 1:
            yield from random_cuts(model_stream_error(error_code), rng)
            return
        yield from random_cuts(payload_part(piece), rng, largest=97)


def botocore_events(data: bytes, seed: int = 0, error_code: str | None = None):
    """The events botocore's own parser reads from `data` cut into random PayloadParts (no client, no server)."""
    import boto3
    from botocore.eventstream import EventStream
    from botocore.parsers import EventStreamJSONParser

    client = boto3.client("sagemaker-runtime", region_name="us-west-2", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    model = client.meta.service_model
    shape = model.operation_model("InvokeEndpointWithResponseStream").output_shape.members["Body"]
    rng = random.Random(seed)
    raw = _Raw(event_stream(random_cuts(data, rng), rng, error_code))
    return EventStream(raw, shape, EventStreamJSONParser(), "InvokeEndpointWithResponseStream")


class _Raw:
    """What botocore reads a response from: `stream()` yields bytes as they come, `close()` ends it."""

    def __init__(self, chunks, closer=None):
        self._chunks, self._closer = iter(chunks), closer

    def stream(self, **_):
        yield from self._chunks

    def read(self, amt=None) -> bytes:  # a whole, small body: StreamingBody reads it at once
        return b"".join(self._chunks)

    def close(self):
        if self._closer:
            self._closer()


def _container_chunks(response: http.client.HTTPResponse):
    while True:
        data = response.read1(65536)
        if not data:
            return
        yield data


def _recut(chunks, rng: random.Random):
    for chunk in chunks:
        yield from random_cuts(chunk, rng)


def sagemaker_runtime(server: FakeLmi, region: str = "us-west-2", calls: list | None = None, seed: int = 0,
                      stream_errors: list[str] | None = None):
    """A real boto3 sagemaker-runtime client answered by `server` through SageMaker's wire formats.

    Needs credentials in the environment (fake ones do: the request is signed, never sent). `calls` collects
    (operation, endpoint name, request headers, body) for assertions. `stream_errors`: SageMaker's own
    ModelStreamError codes, one per coming streamed call (None: no error for that call).
    """
    import boto3
    from botocore.awsrequest import AWSResponse
    from botocore.config import Config

    client = boto3.client("sagemaker-runtime", region_name=region,
                          config=Config(retries={"total_max_attempts": 1}))
    rng = random.Random(seed)
    rng_lock = threading.Lock()
    errors = list(stream_errors or [])

    def forward(request, **_):
        streaming = request.url.endswith("/invocations-response-stream")
        endpoint = request.url.split("/endpoints/", 1)[1].split("/", 1)[0]
        body = request.body if isinstance(request.body, bytes) else (request.body or b"")
        if calls is not None:
            calls.append(("stream" if streaming else "invoke", endpoint, dict(request.headers), json.loads(body)))
        host, port = server.server_address[:2]
        connection = http.client.HTTPConnection(host, port, timeout=ANSWER_WAIT_S)
        connection.request("POST", "/invocations", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            message = response.read().decode()
            connection.close()
            error = {"Message": f"Received server error ({response.status}) from primary with message "
                                f"\"{message.strip()}\".", "OriginalStatusCode": response.status,
                     "OriginalMessage": message.strip()}
            headers = {"x-amzn-ErrorType": "ModelError:http://internal.amazon.com/coral/com.amazon.sagemaker/",
                       "Content-Type": "application/json"}
            return AWSResponse(request.url, 424, headers, _Raw([json.dumps(error).encode()]))
        if streaming:
            with rng_lock:
                call_rng = random.Random(rng.random())
                error_code = errors.pop(0) if errors else None
            headers = {"Content-Type": "application/vnd.amazon.eventstream",
                       "X-Amzn-SageMaker-Content-Type": response.getheader("Content-Type", "")}
            parts = _recut(_container_chunks(response), call_rng)
            return AWSResponse(request.url, 200, headers,
                               _Raw(event_stream(parts, call_rng, error_code), connection.close))
        data = response.read()
        connection.close()
        return AWSResponse(request.url, 200, {"Content-Type": "application/json"}, _Raw([data]))

    client.meta.events.register("before-send.sagemaker-runtime.*", forward)
    return client


# --- as a process -------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or Ctrl-C; the stop handlers are installed before this runs (see the end)."""
    from common import processes

    parser = argparse.ArgumentParser(prog="python -m tests.fake_lmi", description="A loopback fake of LMI.")
    parser.add_argument("--mode", choices=("dynamic", "rolling"), default="rolling", help="batching mode")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args(argv)
    print(f"fake LMI: starting (pid {os.getpid()}); Ctrl-C or SIGTERM stops", flush=True)
    server = None
    try:
        server = FakeLmi(args.mode, port=args.port).__enter__()
        print(f"listening on {server.url}", flush=True)
        while True:
            time.sleep(3600)
    except processes.Stopped as stopped:
        print(f"fake LMI: stopping ({stopped.args[0]})", flush=True)
    except OSError as error:
        print(f"fake LMI: error: cannot listen on 127.0.0.1:{args.port}: {error.strerror or error}", file=sys.stderr)
        return 1
    finally:
        with processes.shielded():
            if server is not None:
                server.__exit__(None, None, None)
    return processes.exit_status(processes.received())

if __name__ == "__main__":
    from common import processes

    processes.install_stop_handlers()
    processes.finish(main())
