"""Token streams from LMI (DJL Serving): what to ask for, how to read it, and the timings users care about.

What the container does, read at DJL Serving's release branches (`engines/python/setup/djl_python/`):
- 0.27 and later, rolling batch: a request asks for a stream with `"stream": true` at the top level of the
  payload. 0.33's `input_parser.py` copies it into the parameters (`parameters["stream"] = payload.get("stream",
  False)`), `request.py` pops it and calls `output_formatter.get_output_formatter(formatter, stream, tgi_compat)`,
  which picks `_jsonlines_output_formatter` with content type `application/jsonlines` (or server-sent events,
  `data: <json line>`, for TGI-compatible requests). Each line is one token, `{"token": {"id": 42, "text": " the",
  "log_prob": -0.3}}`; the last line also carries `"generated_text"` (and `"details"` when asked, or
  `{"finish_reason": "error"}`); a failed generation's token has `"error_msg"`. 0.35 is the same.
- 0.23 rolling batch streams only with `option.output_formatter=jsonlines` (a container setting):
  `{"outputs": ["text", ...]}` per line (`rolling_batch/rolling_batch.py`).
- Dynamic batching (no rolling batch) does not stream per request: `huggingface.py` `_streaming_inference`
  needs the container-wide `option.enable_streaming` and refuses batches of more than one request ("Dynamic
  batch not supported for generic streaming"). Benchmarks therefore send dynamic mode plain requests.

Timings (seconds from the moment the request was sent, per request):
- time to first token (TTFT): arrival of the first token line;
- inter-token latency (ITL): gaps between consecutive token arrivals of one request (the first token is not a
  gap); tokens that arrive in one network read share a timestamp, so their gap is 0;
- per-client output rate: tokens of the request / its whole latency, the rate one user sees.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

STREAM_ACCEPT = "application/jsonlines"


class StreamFailed(RuntimeError):
    """The server reported an error inside the stream (a token with error_msg, or a SageMaker stream error)."""

    def __init__(self, message: str, kind: str = "5xx"):
        super().__init__(message)
        self.kind = kind


def stream_payload(prompt: str, max_new_tokens: int, stream: bool) -> dict:
    """LMI's request; max_new_tokens is always sent (LMI's default is 30), `stream` only when asked."""
    payload: dict = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens}}
    if stream:
        payload["stream"] = True
    return payload


@dataclass
class TokenStream:
    """Tokens of one streamed answer with their arrival times, read from raw chunks as they arrive."""

    times: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    final_text: str | None = None  # "generated_text" of the last line, or a whole non-streamed JSON answer
    error: str | None = None
    lines: int = 0
    _buffer: bytes = b""

    def feed(self, at: float, chunk: bytes) -> list[str]:
        """Add a chunk that arrived `at` seconds after sending; returns the texts of the tokens it completed."""
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n")
        added: list[str] = []
        for line in complete:
            added += self._line(at, line)
        return added

    def finish(self, at: float) -> list[str]:
        """The end of the response: a last line without a newline still counts."""
        rest, self._buffer = self._buffer, b""
        return self._line(at, rest)

    def _line(self, at: float, raw: bytes) -> list[str]:
        line = raw.strip()
        if line.startswith(b"data:"):  # server-sent events (TGI-compatible output)
            line = line[5:].strip()
        if not line:
            return []
        self.lines += 1
        try:
            item = json.loads(line)
        except ValueError:
            self.error = self.error or f"not a JSON line: {line[:80].decode('utf-8', 'replace')}"
            return []
        if isinstance(item, list) and len(item) == 1:  # TGI-compatible whole answers come as a one-item list
            item = item[0]
        if not isinstance(item, dict):
            return []
        texts: list[str] = []
        token = item.get("token")
        if isinstance(token, dict):
            if token.get("error_msg"):
                self.error = str(token["error_msg"])
            elif isinstance(token.get("text"), str) and not token.get("special_token"):
                texts.append(token["text"])
        outputs = item.get("outputs")  # 0.23's jsonlines formatter
        if isinstance(outputs, list):
            texts += [text for text in outputs if isinstance(text, str)]
        if isinstance(item.get("generated_text"), str):
            self.final_text = item["generated_text"]
        if item.get("error") and not self.error:  # a non-streamed error answer
            self.error = str(item["error"])
        if ((item.get("details") or {}).get("finish_reason") == "error") and not self.error:
            self.error = "finish_reason error"
        self.times += [at] * len(texts)
        self.texts += texts
        return texts

    @property
    def streamed(self) -> bool:
        return bool(self.times)

    @property
    def ttft(self) -> float | None:
        return self.times[0] if self.times else None

    @property
    def itl(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.times, self.times[1:], strict=False)]

    @property
    def text(self) -> str:
        return "".join(self.texts) if self.texts else (self.final_text or "")


def read_stream(chunks: Iterable[tuple[float, bytes]]) -> TokenStream:
    """A TokenStream from (arrival time, chunk) pairs already received."""
    stream = TokenStream()
    last = 0.0
    for at, chunk in chunks:
        stream.feed(at, chunk)
        last = at
    stream.finish(last)
    return stream


def http_chunks(response, size: int = 65536) -> Iterator[bytes]:
    """Bytes of an http.client response as the server sends them (chunked transfer encoding or not)."""
    while True:
        data = response.read1(size)
        if not data:
            # read1 leaves a Content-Length response open once its length is used up; read() marks it done,
            # else the next request on this keep-alive connection fails with ResponseNotReady.
            response.read()
            return
        yield data


def sagemaker_chunks(body) -> Iterator[bytes]:
    """PayloadPart bytes of an InvokeEndpointWithResponseStream body, as they arrive.

    botocore raises EventStreamError (a ClientError: ModelStreamError, InternalStreamFailure) itself while
    iterating; an event dict carrying one of those keys (a hand-made stream) is turned into StreamFailed.
    """
    for event in body:
        if "PayloadPart" in event:
            data = event["PayloadPart"].get("Bytes") or b""
            if data:
                yield data
        for name in ("ModelStreamError", "InternalStreamFailure"):
            if name in event:
                error = event[name] or {}
                code = error.get("ErrorCode")
                raise StreamFailed(f"{name}{f' {code}' if code else ''}: {error.get('Message', '')}".strip())
