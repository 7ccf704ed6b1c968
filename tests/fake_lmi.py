"""A loopback stand-in for LMI (DJL Serving) and for SageMaker's runtime in front of it, for tests without AWS.

`FakeLmi` listens on 127.0.0.1 and answers `POST /invocations` like the container: it batches requests the way
the chosen mode does (dynamic: up to `batch_size` requests gathered for `max_batch_delay_s`, answered whole;
rolling: up to `max_rolling` requests decoding together, newcomers joining between tokens), streams one JSON line
per token when a request says `"stream": true` (rolling only, as in DJL Serving), and fails on demand.
Timings are controllable (`prefill_s`, `token_s`) so tests can reason about TTFT and gaps without being slow.

`sagemaker_runtime(server)` is a real boto3 `sagemaker-runtime` client whose HTTP layer is replaced by a
`before-send` hook that forwards the signed request's body to the fake server and wraps the answer as
SageMaker does: `InvokeEndpoint` returns the body, `InvokeEndpointWithResponseStream` returns AWS event-stream
messages (PayloadPart per chunk, ModelStreamError for a failure mid-stream) that botocore's own parser decodes,
and a container error becomes a 424 ModelError. Nothing leaves the machine.

As a process, for trying a client against it or checking how it stops (tests/test_signals.py):

    python -m tests.fake_lmi --mode rolling --port 8081

It prints `listening on http://127.0.0.1:PORT/invocations` once it answers, and stops on SIGTERM (exit 0) or Ctrl-C
(exit 130), to the process or its group, once or repeated (`inference.processes`).
"""

from __future__ import annotations

import argparse
import binascii
import http.client
import json
import os
import queue
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_DONE = object()
ANSWER_WAIT_S = 10.0  # the most a handler waits for the scheduler's next token before giving up


@dataclass
class _Request:
    max_new_tokens: int
    stream: bool
    tokens: queue.Queue = field(default_factory=queue.Queue)
    produced: int = 0
    fail_after: int | None = None


class FakeLmi(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str = "rolling", *, batch_size: int = 4, max_batch_delay_s: float = 0.01,
                 max_rolling: int = 8, prefill_s: float = 0.005, token_s: float = 0.002, port: int = 0):
        if mode not in ("dynamic", "rolling"):
            raise ValueError(f"mode {mode!r}: dynamic or rolling")
        self.mode, self.batch_size, self.max_batch_delay_s = mode, batch_size, max_batch_delay_s
        self.max_rolling, self.prefill_s, self.token_s = max_rolling, prefill_s, token_s
        self.payloads: list[dict | None] = []
        self.batches: list[int] = []  # dynamic: requests per batch; rolling: requests decoding per token step
        self._failures: list[tuple[int, str]] = []  # (HTTP status, message) for the next requests, in order
        self._stream_failures = 0  # the next streamed requests fail after their first token
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

    def fail_next(self, count: int = 1, status: int = 503, message: str = "busy") -> None:
        with self._lock:
            self._failures += [(status, message)] * count

    def fail_streams(self, count: int = 1) -> None:
        with self._lock:
            self._stream_failures += count

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
    def submit(self, payload: dict | None) -> tuple[int, str, _Request | None]:
        """(status, error message, request) for a payload; the request is queued for the scheduler."""
        with self._lock:
            self.payloads.append(payload)
            if self._failures:
                status, message = self._failures.pop(0)
                return status, message, None
            if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), str):
                return 400, "Invalid request payload: 'inputs' must be a string", None
            parameters = payload.get("parameters") or {}
            request = _Request(int(parameters.get("max_new_tokens", 30)),  # LMI's default is 30
                               bool(payload.get("stream")) and self.mode == "rolling")
            if request.stream and self._stream_failures:
                self._stream_failures -= 1
                request.fail_after = 1
            self._waiting.append(request)
            self._lock.notify_all()
        return 200, "", request

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
                    for _ in range(request.max_new_tokens):
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
        request.tokens.put(f" w{request.produced}")


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
        status, message, request = self.server.submit(payload)
        if request is None:
            self._send(status, json.dumps({"error": message, "code": status}).encode() + b"\n")
            return
        texts: list[str] = []
        if request.stream:
            self.send_response(200)
            self.send_header("Content-Type", "application/jsonlines")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
        while True:
            try:
                text = request.tokens.get(timeout=ANSWER_WAIT_S)
            except queue.Empty:
                self.close_connection = True
                return
            if text is _DONE:
                break
            texts.append(text)
            if request.stream:
                last = len(texts) == request.max_new_tokens
                line = {"token": {"id": len(texts), "text": text, "log_prob": -0.5}}
                if last:
                    line["generated_text"] = "".join(texts)
                self._chunk(json.dumps(line).encode() + b"\n")
        if request.stream:
            if request.fail_after is not None:  # as LMI reports an engine failure: a token with error_msg
                self._chunk(json.dumps({"token": {"id": -1, "text": "", "log_prob": None,
                                                  "error_msg": "engine failed"}}).encode() + b"\n")
            self._chunk(b"")
        else:
            self._send(200, json.dumps({"generated_text": "".join(texts)}).encode() + b"\n")

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


def stream_error(message: str, code: str = "ModelStreamError") -> bytes:
    return event_message({":exception-type": code, ":message-type": "exception", ":content-type": "application/json"},
                         json.dumps({"Message": message, "ErrorCode": "StreamBroken"}).encode())


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


def _stream_events(response: http.client.HTTPResponse, connection: http.client.HTTPConnection):
    """PayloadPart per chunk the container sends; a token line with error_msg becomes a ModelStreamError."""
    try:
        for data in _container_chunks(response):
            if b'"error_msg"' in data:
                yield stream_error("Model stream error: engine failed")
                return
            yield payload_part(data)
    finally:
        connection.close()


def sagemaker_runtime(server: FakeLmi, region: str = "us-west-2", calls: list | None = None):
    """A real boto3 sagemaker-runtime client answered by `server` through SageMaker's wire formats.

    Needs credentials in the environment (fake ones do: the request is signed, never sent). `calls` collects
    (operation, endpoint name, request headers, body) for assertions.
    """
    import boto3
    from botocore.awsrequest import AWSResponse
    from botocore.config import Config

    client = boto3.client("sagemaker-runtime", region_name=region,
                          config=Config(retries={"total_max_attempts": 1}))

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
            headers = {"Content-Type": "application/vnd.amazon.eventstream",
                       "X-Amzn-SageMaker-Content-Type": response.getheader("Content-Type", "")}
            return AWSResponse(request.url, 200, headers, _Raw(_stream_events(response, connection),
                                                               connection.close))
        data = response.read()
        connection.close()
        return AWSResponse(request.url, 200, {"Content-Type": "application/json"}, _Raw([data]))

    client.meta.events.register("before-send.sagemaker-runtime.*", forward)
    return client


# --- as a process -------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or Ctrl-C; the stop handlers are installed before this runs (see the end)."""
    from inference import processes

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
    from inference import processes

    processes.install_stop_handlers()
    processes.finish(main())
