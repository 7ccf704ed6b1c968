"""Answers from LMI (DJL Serving): what to ask for, how to read every form the container sends, and the timings.

What the container sends, read at DJL Serving's release branches (github.com/deepjavalibrary/djl-serving,
`engines/python/setup/djl_python/` unless a Java file is named; commits: 0.23.0-dlc 07673c54, 0.33.0-dlc 8b3b685b,
0.35.0-dlc 63786613, 0.36.0-lmi27-dlc 7e13b081). `tests/fake_lmi.py` builds the same bytes, rule by rule.

- vLLM (0.33+, rolling): `"stream": true` gives JSON lines, one per vLLM completion chunk
  (`lmi_vllm/request_response_utils.py` convert_completion_chunk_response_to_lmi_schema):
  `{"index": 0, "token": {"id", "text", "logprob"}, "generated_text": null, "details": null}`, the last line with
  `generated_text`; then empty lines (`async_utils.py` _create_output appends "\\n" to every chunk, empty ones too).
  When the reader falls behind, vLLM merges outputs: one line carries several tokens' text and LMI keeps only the
  first token id. So ids or lines are at best a lower bound of the tokens: see "Output tokens" below.
- vLLM chat (a body with `messages`): the lines are vLLM's own `chat.completion.chunk` objects, the `data: `
  prefix removed (`vllm_stream_output_formatter`); without `stream`, one `chat.completion` object.
- Errors after the 200 (0.33+): DJL appends a compact record with no newline. The engine dying:
  `{"code":500,"message":"Inference Engine Failure",...}` (`AsyncRequestManager.java` terminateInFlightRequests,
  Gson of djl's Output); a formatter failure: `{"error":"...","code":424}` (`Request.java` addResponse); an error
  vLLM reports inside its stream: a line `{"error": ...}` (passed through by the formatter).
- 0.23 rolling (lmi-dist, `rolling_batch/rolling_batch.py`): with option.output_formatter=json (default) the chunks
  form ONE JSON document `{"generated_text": "..."}` built piece by piece, so nothing can be timed per token;
  with jsonlines each chunk is `{"outputs": ["text"]}` and a line. An engine failure appends, after the text
  already sent and with no newline, Gson's record of `Output(code, "Batch inference failed")`
  (`engines/python/src/main/java/ai/djl/python/engine/RollingBatch.java` run): `stop_on_any_exception` empties the
  batch, `huggingface.py` inference then indexes the empty result (IndexError), `djl_python_engine.py` answers
  `Output().error(...)`, code 424. An Output record is an error whatever its code.
- Gson's form: djl's `JsonUtils.GSON` is compact at djl v0.23.0 (bae9212b, what 0.23.0-dlc builds with); from
  djl v0.24.0 it pretty-prints (2-space indent, `"key": value`, one field a line) when the container has
  `DJL_PRETTY_PRINT=true`. So a record after a started stream may span lines; the reader takes any non-JSON line
  after text as the start of such a trailer and reads DJL's code and message from it when the answer ends.
- Dynamic batching (every version, `huggingface.py`): one whole answer even with `"stream": true`,
  `[{"generated_text": "prompt + answer"}]` pretty-printed over several lines (`outputs.py` Output._encode_json,
  indent=2). A failing handler answers with a non-200 status and Output.error's pretty-printed
  `{"code": 424, "message": ..., "error": ...}` (`outputs.py`).
- SageMaker splits the container's bytes into PayloadPart events anywhere: inside a line, inside a UTF-8
  character. It raises ModelStreamError only itself (ModelInvocationTimeExceeded, StreamBroken); DJL's own errors
  arrive as payload, above.

Output tokens (`token_count`), in order of preference:
- `details`: LMI's details.generated_tokens, sent when the request asks `"details": true` (0.33+ vLLM only:
  inference.llm.lmi.requests details_supported). Whole answers carry vLLM's usage.completion_tokens. Streamed,
  DJL writes usage.completion_tokens + 1 on the last line (`lmi_vllm/request_response_utils.py`
  convert_completion_chunk_response_to_lmi_schema) while vLLM's continuous usage already counts that line's tokens
  (`vllm/entrypoints/openai/serving_completion.py` completion_stream_generator: previous_num_tokens is added to
  before the chunk's usage is set; vllm-project/vllm 2d5f987d, 00463e62), so the reader takes one off. Such a line
  is told apart by its details' `input_length`, which only that function writes (the rolling-batch jsonlines
  formatter `output_formatter.py` get_details_dict writes len(tokens) and `inputs`, taken as is).
- `usage`: a chat answer's usage.completion_tokens (vLLM's own).
- `tokenizer`: the caller's tokenizer over the generated text.
- `ids` or `words`, whichever is larger: both are lower bounds. A merged line keeps one id for several tokens; a
  whitespace word is at least one token for tokenizers that split on whitespace before merging (byte-level BPE,
  SentencePiece's default). The figure is then a lower bound, and reports say so.

Timings, per request, in seconds from sending:
- time to first token (TTFT): arrival of the first line carrying generated text; an answer that came whole
  (one JSON document) has none;
- inter-token latency (ITL): (last text arrival - first text arrival) / (tokens - 1), the mean time per output
  token after the first. Per-line gaps are not used: a merged line holds several tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

STREAM_ACCEPT = "application/jsonlines"
_OUTPUT_RECORD_KEYS = {"code", "message", "properties", "content"}  # Gson of djl's ai.djl.modality.Output
# Where a DJL error record may start inside other text: `{` then its first key, compact or pretty-printed.
_RECORD_START = re.compile(rb'\{\s*"(?:code|error)"\s*:')


class StreamFailed(RuntimeError):
    """The stream itself broke (a SageMaker stream error): no answer to read."""

    def __init__(self, message: str, kind: str = "5xx"):
        super().__init__(message)
        self.kind = kind


LOWER_BOUND_METHODS = ("ids", "words")


def stream_payload(prompt: str, max_new_tokens: int, stream: bool, details: bool = False) -> dict:
    """LMI's request (lmi_input_output_schema.md); max_new_tokens always (LMI's default is 30), stream when asked,
    `"details": true` where the container answers it (inference.llm.lmi.requests details_supported)."""
    payload: dict = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens}}
    if details:
        payload["parameters"]["details"] = True
    if stream:
        payload["stream"] = True
    return payload


def chat_payload(prompt: str, max_tokens: int, stream: bool) -> dict:
    """The OpenAI-compatible form LMI's vLLM service answers as Chat Completions.

    Keys from DJL's `serving/docs/lmi/user_guides/chat_input_output_schema.md`: `messages`, `max_tokens`, `stream`.
    """
    payload: dict = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    if stream:
        payload["stream"] = True
    return payload


def error_message(item) -> str | None:
    """The message of an error in any form DJL sends, or None when `item` is not an error."""
    if not isinstance(item, dict):
        return None
    if "error" in item and item["error"] not in (None, "", {}):
        error = item["error"]
        if isinstance(error, dict):
            error = error.get("message") or json.dumps(error)
        return f"{item['message']}: {error}" if isinstance(item.get("message"), str) else str(error)
    code = item.get("code")
    if isinstance(code, int) and (code >= 400 or item.keys() >= _OUTPUT_RECORD_KEYS):
        return f"{item.get('message') or 'error'} (code {code})"
    return None


def _whole_text(item) -> tuple[str | None, int | None]:
    """(generated text, completion tokens if reported) of a whole answer, or (None, None)."""
    if isinstance(item, list) and item and all(isinstance(one, dict) for one in item):
        texts = [one.get("generated_text") for one in item]
        return ("".join(texts), None) if all(isinstance(text, str) for text in texts) else (None, None)
    if not isinstance(item, dict):
        return None, None
    if isinstance(item.get("generated_text"), str):
        details = item.get("details") or {}
        return item["generated_text"], details.get("generated_tokens")
    if item.get("object") == "chat.completion":
        choices = item.get("choices") or [{}]
        content = ((choices[0] or {}).get("message") or {}).get("content")
        return (content if isinstance(content, str) else None), (item.get("usage") or {}).get("completion_tokens")
    return None, None


@dataclass
class TokenStream:
    """One answer read from raw chunks as they arrive: streamed text pieces with their arrival times, or a whole
    answer, or an error.

    Bytes are split into lines before decoding, so a chunk that ends inside a UTF-8 character or a JSON line is
    simply kept until the rest arrives. A first line that is not JSON starts a whole document (dynamic batching's
    pretty-printed answer, 0.23's json formatter), parsed when the answer ends.
    """

    times: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    final_text: str | None = None  # "generated_text" of the last line, or the text of a whole answer
    whole: bool = False  # the answer was one JSON document, not a stream
    error: str | None = None
    token_ids: int = 0  # ids seen; under load fewer than the tokens (LMI keeps one id per merged line)
    reported_tokens: int | None = None  # details.generated_tokens or usage.completion_tokens, when the server sent it
    reported_by: str | None = None  # "details" or "usage"
    _buffer: bytes = b""
    _document: bool = False
    _trailer: bool = False  # a non-JSON line after text: DJL's error record, maybe over several lines

    def feed(self, at: float, chunk: bytes) -> list[str]:
        """Add a chunk that arrived `at` seconds after sending; returns the text pieces it completed."""
        self._buffer += chunk
        if self._document or self._trailer:
            return []
        *complete, self._buffer = self._buffer.split(b"\n")
        added: list[str] = []
        for number, line in enumerate(complete):
            added += self._line(at, line)
            if self._document or self._trailer:  # keep the bytes whole for finish()
                self._buffer = b"\n".join([*complete[number:], self._buffer])
                break
        return added

    def finish(self, at: float) -> list[str]:
        """The end of the answer: a document or trailer is parsed now; a last line without a newline still counts."""
        rest, self._buffer = self._buffer, b""
        if not self._document and not self._trailer:
            pieces = self._line(at, rest)
            if not self._document and not self._trailer:
                return pieces
        if self._trailer:
            self._read_trailer(rest)
        else:
            self._read_document(rest)
        return []

    def _line(self, at: float, raw: bytes) -> list[str]:
        line = raw.strip()
        if line.startswith(b"data:"):  # server-sent events, for a client that reads vLLM directly
            line = line[5:].strip()
        if not line or line == b"[DONE]":
            return []
        try:
            item = json.loads(line)
        except ValueError:
            if not self.texts and self.final_text is None and self.error is None:
                self._document = True
            elif self.error is None:
                self._trailer = True  # read whole at the end: a pretty-printed record spans lines
            return []
        message = error_message(item)
        if message is not None:
            self.error = self.error or message
            return []
        texts = self._pieces(item)
        self.times += [at] * len(texts)
        self.texts += texts
        return texts

    def _pieces(self, item) -> list[str]:
        if not isinstance(item, dict) or not ({"token", "outputs"} & item.keys() or
                                               item.get("object") == "chat.completion.chunk"):
            text, reported = _whole_text(item)  # a whole answer on one line (no stream asked, or none possible)
            if text is None:
                self.error = self.error or f"unknown answer: {json.dumps(item)[:80]}"
            else:
                self.final_text, self.whole = text, True
                self._report(reported, "usage" if "usage" in item else "details")
            return []
        texts: list[str] = []
        token = item.get("token")
        if isinstance(token, dict):
            if isinstance(token.get("id"), int):
                self.token_ids += 1
            if isinstance(token.get("text"), str) and token["text"] and not token.get("special_token"):
                texts.append(token["text"])
        if isinstance(item.get("outputs"), list):  # 0.23's jsonlines formatter
            texts += [text for text in item["outputs"] if isinstance(text, str) and text]
        for choice in item.get("choices") or []:  # a chat.completion.chunk
            content = ((choice or {}).get("delta") or {}).get("content")
            if isinstance(content, str) and content:
                texts.append(content)
        if isinstance(item.get("generated_text"), str):
            self.final_text = item["generated_text"]
        details = item.get("details") or {}
        if isinstance(details.get("generated_tokens"), int):
            # DJL's vLLM stream line (the only one with input_length) says usage.completion_tokens + 1: see above.
            self._report(details["generated_tokens"] - ("input_length" in details), "details")
        if isinstance((item.get("usage") or {}).get("completion_tokens"), int):
            self._report(item["usage"]["completion_tokens"], "usage")
        if details.get("finish_reason") == "error":
            self.error = self.error or "finish_reason error"
        return texts

    def _read_document(self, data: bytes) -> None:
        try:
            item = json.loads(data)
        except ValueError:
            self.error = self.error or self._trailing_error(data) or \
                f"not JSON: {data[:80].decode('utf-8', 'replace')}"
            return
        message = error_message(item)
        if message is not None:
            self.error = self.error or message
            return
        text, reported = _whole_text(item)
        if text is None:
            self.error = self.error or f"unknown answer: {json.dumps(item)[:80]}"
            return
        self.final_text, self.whole = text, True
        self._report(reported, "usage" if isinstance(item, dict) and "usage" in item else "details")

    def _report(self, tokens, method: str) -> None:
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            self.reported_tokens, self.reported_by = tokens, method

    def _read_trailer(self, data: bytes) -> None:
        """What followed the streamed lines: DJL's error record (compact or pretty-printed), else an error anyway."""
        self.error = self.error or self._trailing_error(data) or \
            f"not a JSON line: {data.strip().splitlines()[0][:80].decode('utf-8', 'replace')}"

    @staticmethod
    def _trailing_error(data: bytes) -> str | None:
        """The message of the last DJL error record in `data`, whatever precedes it (0.23's json formatter's text
        cut short, or JSON lines), compact or pretty-printed; None when there is none."""
        decoder = json.JSONDecoder()
        for match in reversed(list(_RECORD_START.finditer(data))):
            try:
                item, _end = decoder.raw_decode(data[match.start():].decode("utf-8", "replace"))
            except ValueError:
                continue
            message = error_message(item)
            if message is not None:
                return message
        return None

    @property
    def streamed(self) -> bool:
        return bool(self.times)

    @property
    def ttft(self) -> float | None:
        return self.times[0] if self.times else None

    @property
    def text(self) -> str:
        """The generated text: the streamed pieces, else the whole answer's text."""
        return "".join(self.texts) if self.texts else (self.final_text or "")

    def itl(self, tokens: int) -> list[float]:
        """Mean time per output token after the first, once per gap, for an answer of `tokens` tokens."""
        if not self.streamed or tokens < 2:
            return []
        return [(self.times[-1] - self.times[0]) / (tokens - 1)] * (tokens - 1)


def token_count(answer: TokenStream, text: str, tokenizer_count=None) -> tuple[int, str]:
    """(output tokens, method) of an answer whose generated text is `text`: see "Output tokens" above."""
    if answer.reported_tokens is not None:
        return answer.reported_tokens, answer.reported_by or "details"
    if tokenizer_count is not None:
        return tokenizer_count(text), "tokenizer"
    words = len(text.split())
    return (answer.token_ids, "ids") if answer.token_ids > words else (words, "words")


def error_body_message(body: bytes | str) -> str:
    """The message of a non-200 answer: DJL's JSON record (pretty-printed or not), else the body's first line."""
    data = body.encode() if isinstance(body, str) else body
    answer = read_stream([(0.0, data)])
    if answer.error and not answer.error.startswith(("not JSON", "not a JSON line", "unknown answer")):
        return answer.error
    text = data.decode("utf-8", "replace")
    return (text.strip().splitlines() or [""])[0][:500]


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
    iterating a real stream; an event dict carrying one of those keys is turned into StreamFailed.
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
