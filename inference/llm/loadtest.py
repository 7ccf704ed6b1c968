"""Load-test an endpoint the way the Falcon recipe compared its batching modes: tokens/s and p90 per concurrency.

Targets: a SageMaker endpoint by name (`--endpoint`, boto3 `sagemaker-runtime`, the usual credential chain and
region) or any HTTP URL speaking the container contract (`--url http://127.0.0.1:8080/invocations`, e.g.
`make serve-local`). Workloads: `--kind llm` sends LMI's `{"inputs": prompt, "parameters":
{"max_new_tokens": N}}` with prompts of about `--input-tokens` tokens, always setting max_new_tokens (LMI's
default is 30); `--shape 32x128` and `--shape 256x32` are the recipe's two shapes. `--kind sentiment` sends
`{"inputs": [text, ...]}` batches of `--batch-size` texts; its output unit is labels returned (= texts served).
`--stream` (llm) asks LMI for its token stream and adds time to first token, inter-token latency and per-client
tokens/s to the figures (`inference.llm.stream` says what the container sends and how it is timed). `--chat` (llm)
sends the OpenAI-compatible form (`messages`) that LMI's vLLM service answers as Chat Completions.

Each step runs a fixed number of concurrent clients (threads, one keep-alive connection each) for `--requests`
requests in all or for `--duration` seconds, after `--warmup` requests per client that are not measured.
Output tokens, per answer (`inference.llm.stream` token_count): LMI's own count (`details.generated_tokens`, asked
for with `"details": true` where `--lmi-version` and `--batching` say the container answers it: 0.33+ vLLM), else
`--tokenizer DIR` over the generated text, else the larger of token ids and whitespace words, both lower bounds.
The report names the method of every answer per step and says when the figure is a lower bound. Streamed lines
are never counted as tokens: vLLM merges several tokens into one line when the reader falls behind, exactly when
the endpoint is busy.
Errors never stop the run: they are counted by kind (throttled, 4xx, 5xx, timeout, connection, other). Through
SageMaker the kind comes from the container's own status: InvokeEndpoint relays any container 4xx/5xx as ModelError
(HTTP 424) with OriginalStatusCode, so a container's 429 counts as throttled. `--retries N` sends a throttled
request again (after the body's `retry_after_s`, our sentiment server's hint, or 1, 2, 4 ... s), as a client would;
the default, 0, shows throttling as it happens. Retries are counted per step, and a retried request's latency
includes its waits.

    python -m inference.llm.loadtest --url http://127.0.0.1:8080/invocations --kind sentiment --concurrency 1,2,4
    python -m inference.llm.loadtest --endpoint falcon-rolling --shape 32x128 --concurrency 1,4,16,32 \\
        --requests 200 --lmi-version 0.36.0-lmi27 --batching rolling_paged --out runs/rolling
    python -m inference.llm.loadtest --compare runs/dynamic/report.json runs/rolling/report.json --out runs

Exit status: 0 every step's error rate <= --max-error-rate; 1 some step exceeded it; 2 usage error;
3 the target could not be used at all (unreachable, no credentials, every warm-up request failed); stopped by
SIGTERM 0, by Ctrl-C (SIGINT) 130, either to the process or its group, once or repeated (`common.processes`); a
stopped run still prints and writes the steps that finished.
Statistics are defined in `inference.llm.loadtest_report`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from common import processes
from common.cli_types import fraction, non_negative_int, positive, positive_int, positive_int_list
from inference.llm import loadtest_report as reports
from inference.llm.loadtest_report import Sample
from inference.llm.stream import (
    LOWER_BOUND_METHODS,
    STREAM_ACCEPT,
    StreamFailed,
    TokenStream,
    chat_payload,
    error_body_message,
    http_chunks,
    read_stream,
    sagemaker_chunks,
    stream_payload,
    token_count,
)

PROG = "python -m inference.llm.loadtest"
JSON = "application/json"
SHAPES = {"32x128": (32, 128), "256x32": (256, 32)}  # the Falcon recipe's two request shapes (in x out tokens)
SAMPLE_DIR = Path(__file__).resolve().parents[2] / "training" / "data" / "sample"
EXIT_OK, EXIT_ERROR_RATE, EXIT_USAGE, EXIT_TARGET, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# Prompt material for --kind llm: plain sentences, repeated and rotated to reach the wanted length.
SENTENCE_BANK = (
    "The committee met on Tuesday to review the budget for the coming year.",
    "Rain is expected in the northern valleys by the end of the week.",
    "She packed a small bag, locked the door and walked to the station.",
    "Engineers replaced the old bridge cables after a routine inspection.",
    "The library extends its opening hours during the examination period.",
    "A quiet harbour town draws painters every summer for its evening light.",
    "Farmers planted barley early this season because the soil warmed quickly.",
    "The museum opened a new wing dedicated to maps and navigation tools.",
    "Our team wrote down every step so the next release would be easier.",
    "Trains between the two cities run every half hour on weekdays.",
)
FALLBACK_TEXTS = (
    "What a wonderful morning, the coffee is perfect.",
    "The train was late again and nobody told us why.",
    "The meeting is scheduled for three o'clock.",
    "I can't believe how rude the staff were today.",
    "Loving the new update, everything feels faster!",
    "The report will be published next week.",
)
PROMPT_VARIANTS = 8  # distinct prompts / batches, so a server cache cannot answer every request from one entry


class TargetError(RuntimeError):
    """The target cannot be used at all (unreachable, no credentials): one line, exit status 3."""


@dataclass
class Outcome:
    """What a target returns for one request: the transport's view, before the workload reads the body."""

    latency: float
    status: int | None = None
    body: bytes = b""
    ttfb: float | None = None
    error: str | None = None
    detail: str = ""
    # With streaming: (seconds since sending, bytes) per network read, so the workload can time each token.
    chunks: list[tuple[float, bytes]] | None = None
    retry_after_s: float | None = None  # the server's hint with a throttled answer (our sentiment server's 429)


class Target(Protocol):
    """Something that answers request bodies; `invoke` must never raise, and may be called from many threads."""

    ttfb_note: str
    stream: bool

    def describe(self) -> dict: ...

    def probe(self) -> None: ...

    def invoke(self, body: bytes) -> Outcome: ...

    def close(self) -> None: ...


def status_kind(status: int) -> str | None:
    """None for success, else the error kind of an HTTP status (429 is throttling, not a plain 4xx)."""
    if 200 <= status < 300:
        return None
    if status == 429:
        return "throttled"
    if 400 <= status < 500:
        return "4xx"
    if 500 <= status < 600:
        return "5xx"
    return "other"


def retry_hint(body: bytes | str | None) -> float | None:
    """`retry_after_s` from an error body's first JSON line (our sentiment server's 429), if any."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    try:
        value = json.loads((text.strip().splitlines() or ["{}"])[0]).get("retry_after_s")
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class HttpTarget:
    """POST to a URL with stdlib http.client: one keep-alive connection per client thread, TTFB measurable.

    `timeout` bounds each socket operation, and a response that arrives later than `timeout` after the request
    started is also counted as a timeout, so the limit is per request like SageMaker's 60 s.
    """

    ttfb_note = "time to the first byte of the response body"

    def __init__(self, url: str, timeout: float = 60.0, content_type: str = JSON, stream: bool = False):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url {url}: expected http://host[:port]/path")
        self.url = url
        self.timeout = timeout
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.stream = stream  # read the body as it arrives (chunked transfer encoding), timing every read
        self._headers = {"Content-Type": content_type, "Accept": STREAM_ACCEPT if stream else JSON}
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def describe(self) -> dict:
        return {"type": "http", "url": self.url}

    def probe(self) -> None:
        """Fail fast with one line when nothing listens at the URL's host and port."""
        try:
            socket.create_connection((self.host, self.port), timeout=min(self.timeout, 10)).close()
        except OSError as error:
            raise TargetError(f"cannot connect to {self.host}:{self.port} ({self.url}): "
                              f"{error.strerror or error}") from None

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._connection_class(self.host, self.port, timeout=self.timeout)
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def _drop(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()  # the next request opens a fresh one
            self._local.connection = None

    def invoke(self, body: bytes) -> Outcome:
        connection = self._connection()
        started = time.perf_counter()
        try:
            connection.request("POST", self.path, body=body, headers=self._headers)
            response = connection.getresponse()
            chunks = None
            if self.stream and 200 <= response.status < 300:
                chunks = []
                for chunk in http_chunks(response):
                    chunks.append((time.perf_counter() - started, chunk))
                    if chunks[-1][0] > self.timeout:
                        raise TimeoutError
                ttfb = chunks[0][0] if chunks else None
                data = b"".join(chunk for _, chunk in chunks)
            else:
                first = response.read(1)
                ttfb = time.perf_counter() - started
                data = first + response.read()
            latency = time.perf_counter() - started
        except TimeoutError:
            self._drop()
            return Outcome(time.perf_counter() - started, error="timeout", detail=f"no answer within {self.timeout} s")
        except OSError as error:  # refused, reset, closed by the server before answering
            self._drop()
            return Outcome(time.perf_counter() - started, error="connection",
                           detail=_one_line(f"{type(error).__name__}: {error}"))
        except http.client.HTTPException as error:  # a malformed or truncated response
            self._drop()
            return Outcome(time.perf_counter() - started, error="other",
                           detail=_one_line(f"{type(error).__name__}: {error}"))
        if latency > self.timeout:
            return Outcome(latency, response.status, data, ttfb, "timeout",
                           f"answered after {latency:.1f} s, over the {self.timeout} s limit")
        kind = status_kind(response.status)
        detail = "" if kind is None else _one_line(f"HTTP {response.status}: {error_body_message(data)}")
        hint = retry_hint(data) if kind == "throttled" else None
        return Outcome(latency, response.status, data, ttfb, kind, detail, chunks, hint)

    def close(self) -> None:
        """Close every client's connection; called between steps so each step starts from fresh connections."""
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._local = threading.local()


def classify_client_error(error) -> tuple[str, str]:
    """(kind, detail) for a botocore ClientError from invoke_endpoint.

    ModelError is SageMaker relaying the container's answer (HTTP 424): its OriginalStatusCode says what the
    container did; code 0 with "timed out" is the 60 s invocation limit.
    """
    response = getattr(error, "response", {}) or {}
    code = (response.get("Error") or {}).get("Code", "")
    message = (response.get("Error") or {}).get("Message", "") or str(error)
    detail = _one_line(f"{code}: {message}")
    if code in ("ThrottlingException", "Throttling", "TooManyRequestsException"):
        return "throttled", detail
    if code == "ModelError":
        original = response.get("OriginalStatusCode")
        if isinstance(original, int) and original >= 400:
            return status_kind(original) or "other", detail
        if "timed out" in message.lower():
            return "timeout", detail
        return "5xx", detail  # code 0: the container gave no answer at all
    if code in ("ValidationError", "ValidationException"):
        return "4xx", detail
    if code in ("ModelStreamError", "InternalStreamFailure"):  # raised while reading a response stream
        return "5xx", detail
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    if isinstance(status, int):
        return status_kind(status) or "other", detail
    return "other", detail


class SageMakerTarget:
    """`invoke_endpoint` on a SageMaker real-time endpoint, without retries so throttling shows up as such.

    invoke_endpoint returns the whole body at once, so time to first byte is not measurable there and is
    reported as n/a. With `stream=True` it calls invoke_endpoint_with_response_stream instead and times every
    PayloadPart event as it arrives (the request then asks LMI for its JSON-lines token stream).
    """

    def __init__(self, endpoint: str, region: str | None = None, timeout: float = 60.0, client=None,
                 max_connections: int = 10, stream: bool = False):
        self.endpoint = endpoint
        self.timeout = timeout
        self.stream = stream
        self.ttfb_note = ("time to the first PayloadPart event of the response stream" if stream else
                          "n/a for SageMaker invoke_endpoint (the whole body arrives at once)")
        self.client = client or self._make_client(region, timeout, max_connections)
        self.region = self.client.meta.region_name

    @staticmethod
    def _make_client(region: str | None, timeout: float, max_connections: int):
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        try:
            session = boto3.session.Session(region_name=region)
            credentials = session.get_credentials()
        except BotoCoreError as error:  # a broken profile or credential source
            raise TargetError(f"AWS credentials: {_one_line(str(error))}") from None
        if session.region_name is None:
            raise TargetError("no AWS region: pass --region or set AWS_REGION")
        if credentials is None:
            raise TargetError("no AWS credentials found (environment, profile, SSO or instance role)")
        config = Config(read_timeout=timeout, connect_timeout=min(timeout, 10),
                        retries={"total_max_attempts": 1},  # a retried throttle would hide the throttling
                        max_pool_connections=max(10, max_connections))  # the default 10 would cap concurrency
        return session.client("sagemaker-runtime", config=config)

    def describe(self) -> dict:
        return {"type": "sagemaker", "endpoint": self.endpoint, "region": self.region}

    def probe(self) -> None:
        """Nothing to check without invoking: credentials and region were checked when the client was made."""

    def invoke(self, body: bytes) -> Outcome:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            ReadTimeoutError,
        )

        started = time.perf_counter()
        chunks = None
        try:
            if self.stream:
                response = self.client.invoke_endpoint_with_response_stream(
                    EndpointName=self.endpoint, Body=body, ContentType=JSON, Accept=STREAM_ACCEPT)
                chunks = []
                for chunk in sagemaker_chunks(response["Body"]):
                    chunks.append((time.perf_counter() - started, chunk))
                data = b"".join(chunk for _, chunk in chunks)
            else:
                response = self.client.invoke_endpoint(EndpointName=self.endpoint, Body=body, ContentType=JSON,
                                                       Accept=JSON)
                data = response["Body"].read()
        except StreamFailed as error:
            return Outcome(time.perf_counter() - started, error=error.kind, detail=_one_line(str(error)))
        except ClientError as error:
            kind, detail = classify_client_error(error)
            hint = retry_hint((getattr(error, "response", {}) or {}).get("OriginalMessage")) \
                if kind == "throttled" else None
            return Outcome(time.perf_counter() - started, error=kind, detail=detail, retry_after_s=hint)
        except (ReadTimeoutError, ConnectTimeoutError) as error:
            return Outcome(time.perf_counter() - started, error="timeout", detail=_one_line(str(error)))
        except (EndpointConnectionError, ConnectionClosedError) as error:
            return Outcome(time.perf_counter() - started, error="connection", detail=_one_line(str(error)))
        except (BotoCoreError, OSError) as error:
            return Outcome(time.perf_counter() - started, error="other",
                           detail=_one_line(f"{type(error).__name__}: {error}"))
        return Outcome(time.perf_counter() - started, 200, data, chunks[0][0] if chunks else None, chunks=chunks)

    def close(self) -> None:
        pass  # the client's pool is shared by all steps


# --------------------------------------------------------------------------------------------- workloads


class WordCounter:
    name = "whitespace words"
    unit = "words"

    def __call__(self, text: str) -> int:
        return len(text.split())


class TokenizerCounter:
    """Tokens as the given Hugging Face tokenizer splits them, without special tokens."""

    unit = "tokens"

    def __init__(self, directory: str):
        from transformers import AutoTokenizer

        self.name = f"tokenizer {directory}"
        self.tokenizer = AutoTokenizer.from_pretrained(directory)

    def __call__(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def truncate(self, text: str, tokens: int) -> str:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
        return self.tokenizer.decode(ids)


def make_prompt(tokens: int, counter: Callable[[str], int], offset: int = 0) -> str:
    """About `tokens` tokens (words without a tokenizer) of sentence-bank text, starting at word `offset`."""
    words = " ".join(SENTENCE_BANK).split()
    if not isinstance(counter, TokenizerCounter):
        return " ".join(words[(offset + i) % len(words)] for i in range(tokens))
    # Every word is at least one token, so `tokens` words are enough; find the fewest that reach the length.
    candidate = [words[(offset + i) % len(words)] for i in range(max(tokens, 1))]
    low, high = 1, len(candidate)
    while low < high:
        middle = (low + high) // 2
        if counter(" ".join(candidate[:middle])) >= tokens:
            high = middle
        else:
            low = middle + 1
    return counter.truncate(" ".join(candidate[:low]), tokens)


@dataclass
class Payload:
    body: bytes
    prompt: str = ""
    size: int = 1  # texts in a sentiment batch


@dataclass
class Workload:
    """Request bodies to cycle through and how to read a successful answer into an output count."""

    kind: str
    payloads: list[Payload]
    counter: Callable[[str], int]
    shape: dict = field(default_factory=dict)

    def read(self, payload: Payload, chunks: list[tuple[float, bytes]],
             sample: Sample) -> tuple[list[str], TokenStream | None]:
        """Fill `sample` from a 200 answer (its chunks with arrival times); returns the generated texts to count
        after the step, and the LLM answer read (its timings need the count).

        An LLM answer is read in every form LMI sends (`inference.llm.stream`): a token stream gives TTFT; a
        whole answer gives none; an error DJL sent inside the 200 (after a stream, or in place of an answer)
        makes the request a server error with DJL's message kept.
        """
        body = b"".join(chunk for _, chunk in chunks)
        if self.kind == "sentiment":
            try:
                answer = json.loads(body)
            except ValueError:
                sample.error = "other"
                sample.detail = f"response is not JSON: {_one_line(body.decode('utf-8', 'replace'), 80)}"
                return [], None
            if not isinstance(answer, list):
                sample.error, sample.detail = "other", f"expected a list of labels, got {type(answer).__name__}"
                return [], None
            sample.output = len(answer)
            return [], None
        answer = read_stream(chunks)
        if answer.error:
            known = not answer.error.startswith(("not JSON", "not a JSON line", "unknown answer"))
            sample.error = "5xx" if known else "other"
            sample.detail = f"error in the answer: {_one_line(answer.error, 120)}"
            return [], None
        text = answer.text
        if not answer.streamed and payload.prompt and text.startswith(payload.prompt):
            text = text[len(payload.prompt):]  # dynamic batching returns prompt + answer: count what was generated
        sample.ttft = answer.ttft
        return [text], answer


def sample_texts() -> list[str]:
    """Texts of the repository's sample data, else a built-in list, so sentiment runs work anywhere."""
    texts = []
    for path in sorted(SAMPLE_DIR.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                text = json.loads(line).get("text") if line.strip() else None
            except (ValueError, AttributeError):
                text = None
            if isinstance(text, str) and text:
                texts.append(text)
    return texts or list(FALLBACK_TEXTS)


def llm_workload(input_tokens: int, output_tokens: int, counter, stream: bool = False,
                 chat: bool = False, details: bool = False) -> Workload:
    """LMI's request form, or with `chat` the OpenAI-compatible one (`messages`, `max_tokens`) that LMI's vLLM
    service answers as Chat Completions (chat_input_output_schema.md). `details`: ask LMI for
    details.generated_tokens (only where the container answers it: inference.llm.lmi details_supported)."""
    payloads = []
    for variant in range(PROMPT_VARIANTS):
        prompt = make_prompt(input_tokens, counter, offset=variant * 7)
        request = chat_payload(prompt, output_tokens, stream) if chat else \
            stream_payload(prompt, output_tokens, stream, details=details)
        body = json.dumps(request).encode()
        payloads.append(Payload(body, prompt))
    measured = [counter(payload.prompt) for payload in payloads]
    shape = {"input_tokens": input_tokens, "output_tokens": output_tokens,
             "prompt_lengths": sorted(set(measured)), "prompt_unit": counter.unit,
             "request_form": "chat" if chat else "lmi", "details_asked": details and not chat}
    return Workload("llm", payloads, counter, shape)


def sentiment_workload(batch_size: int, texts: Sequence[str] | None = None) -> Workload:
    texts = list(texts or sample_texts())
    payloads = []
    for variant in range(PROMPT_VARIANTS):
        batch = [texts[(variant * batch_size + i) % len(texts)] for i in range(batch_size)]
        payloads.append(Payload(json.dumps({"inputs": batch}).encode(), size=batch_size))
    return Workload("sentiment", payloads, WordCounter(), {"batch_size": batch_size})


# ------------------------------------------------------------------------------------------ load generation


@dataclass
class _Record:
    sample: Sample
    texts: list[str]
    answer: TokenStream | None = None


RETRY_BACKOFF_S, RETRY_BACKOFF_CAP_S = 1.0, 20.0


def _request(target: Target, workload: Workload, payload: Payload, retries: int = 0) -> _Record:
    started = time.perf_counter()
    try:
        outcome = target.invoke(payload.body)
        attempt = 0
        while outcome.error == "throttled" and attempt < retries:
            time.sleep(min(max(outcome.retry_after_s or 0.0, RETRY_BACKOFF_S * 2 ** attempt), RETRY_BACKOFF_CAP_S))
            attempt += 1
            outcome = target.invoke(payload.body)
        latency = outcome.latency if not attempt else time.perf_counter() - started
        sample = Sample(latency, outcome.error, outcome.ttfb, 0, outcome.detail, retries=attempt)
        if outcome.error is not None:
            return _Record(sample, [])
        texts, answer = workload.read(payload, outcome.chunks or [(outcome.latency, outcome.body)], sample)
        if answer is not None and not (outcome.chunks is not None and answer.streamed):
            sample.ttft = None  # a whole answer (or a body read at once): no token timing to claim
    except Exception as error:  # an unforeseen failure is counted with its name; one request never ends a run
        return _Record(Sample(time.perf_counter() - started, "other",
                              detail=_one_line(f"{type(error).__name__}: {error}")), [])
    return _Record(sample, texts, answer)


def run_step(target: Target, workload: Workload, concurrency: int, requests: int | None = None,
             duration: float | None = None, warmup: int = 1, progress=None,
             stop: threading.Event | None = None, retries: int = 0) -> dict:
    """One step: `concurrency` client threads, each warming up, then together sending until the step is done.

    Bounded both ways: by `requests` in all, or by `duration` seconds (requests in flight at the deadline
    finish and count); each request is bounded by the target's timeout.
    """
    if (requests is None) == (duration is None):
        raise ValueError("give exactly one of requests and duration")
    stop = stop or threading.Event()
    lock = threading.Lock()
    issued = 0
    clock: dict[str, float] = {}
    measured: list[_Record] = []
    warmups: list[_Record] = []

    def start_clock():
        clock["start"] = time.perf_counter()
        if duration is not None:
            clock["deadline"] = clock["start"] + duration

    barrier = threading.Barrier(concurrency, action=start_clock)

    def client(index: int):
        nonlocal issued
        try:
            for i in range(warmup):
                if stop.is_set():
                    break
                warmups.append(_request(target, workload, workload.payloads[(index + i) % len(workload.payloads)],
                                        retries))
            barrier.wait()
            while not stop.is_set():
                with lock:
                    if requests is not None and issued >= requests:
                        break
                    if duration is not None and time.perf_counter() >= clock["deadline"]:
                        break
                    number = issued
                    issued += 1
                measured.append(_request(target, workload, workload.payloads[number % len(workload.payloads)],
                                         retries))
                if progress is not None:
                    progress.update(1)
        except threading.BrokenBarrierError:
            pass
        except BaseException:
            barrier.abort()  # never leave the other clients waiting for this one
            raise

    threads = [threading.Thread(target=client, args=(i,), name=f"loadtest-client-{i}", daemon=True)
               for i in range(concurrency)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.2)  # wake up for Ctrl-C
    except (KeyboardInterrupt, processes.Stopped):
        stop.set()
        barrier.abort()
        for thread in threads:
            thread.join(timeout=1)  # daemon threads: one stuck in a long request must not hold up the exit
        raise
    finally:
        target.close()
    wall = time.perf_counter() - clock["start"] if "start" in clock else 0.0
    # Counting tokens after the step keeps tokenizer work off the clients' clock and out of their threads.
    tokenizer = workload.counter if isinstance(workload.counter, TokenizerCounter) else None
    for record in measured:
        if record.texts and record.answer is not None:
            record.sample.output, record.sample.method = token_count(record.answer, "".join(record.texts), tokenizer)
        elif record.texts:
            record.sample.output = sum(workload.counter(text) for text in record.texts)
        if record.answer is not None and record.sample.ttft is not None:
            record.sample.itl = record.answer.itl(record.sample.output)
    return reports.summarize([r.sample for r in measured], wall, concurrency, [r.sample for r in warmups])


def _progress_bar(total: int | None, concurrency: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    # disable=None: only on a terminal, so logs and CI output don't fill with carriage-return updates.
    return tqdm(total=total, desc=f"{concurrency} client{'s' if concurrency > 1 else ''}", unit="req",
                file=sys.stderr, leave=False, dynamic_ncols=True, disable=None)


@dataclass
class RunSettings:
    concurrencies: list[int]
    requests: int | None = None  # in all per step; None: `per_client` each, or the duration
    per_client: int = 10
    duration: float | None = None
    warmup: int = 1
    max_error_rate: float = 0.01
    progress: bool = True
    label: str = ""
    retries: int = 0  # sends again after a throttled answer


def run(target: Target, workload: Workload, settings: RunSettings, token_counter: str,
        stop: threading.Event | None = None) -> dict:
    """Every step of the sweep, in order; returns the report (steps and run metadata)."""
    streamed = workload.kind == "llm" and bool(getattr(target, "stream", False))
    llm = workload.kind == "llm"
    report = {
        "tool": "inference.llm.loadtest",
        "version": reports.REPORT_VERSION,
        "label": settings.label,
        "target": target.describe(),
        "kind": workload.kind,
        "shape": workload.shape,
        "unit": "tokens" if llm else "labels",
        # Never one per line: vLLM merges several tokens into one line when the reader falls behind.
        "token_counter": token_counter if llm else "labels returned",
        "token_count_rule": "per answer: LMI's details.generated_tokens (or a chat answer's usage), else the "
        "tokenizer, else the larger of token ids and whitespace words (both lower bounds); never one per streamed "
        "line" if llm else None,
        "details_asked": bool(workload.shape.get("details_asked")),
        "stream": streamed,
        "ttfb_note": target.ttfb_note,
        "timeout_s": getattr(target, "timeout", None),
        "warmup_per_client": settings.warmup,
        "requests_per_step": settings.requests or (None if settings.duration else f"{settings.per_client} per client"),
        "duration_per_step_s": settings.duration,
        "max_error_rate": settings.max_error_rate,
        "retries": settings.retries,
        "started_at": _now(),
        "finished_at": None,
        "interrupted": False,
        "steps": [],
    }
    try:
        for concurrency in settings.concurrencies:
            requests = None if settings.duration else settings.requests or settings.per_client * concurrency
            bar = _progress_bar(requests, concurrency, settings.progress)
            try:
                step = run_step(target, workload, concurrency, requests, settings.duration, settings.warmup, bar,
                                stop, settings.retries)
            finally:
                if bar is not None:
                    bar.close()
            report["steps"].append(step)
            if settings.warmup and step["warmup_requests"] and step["warmup_errors"] == step["warmup_requests"] \
                    and step["error_count"] == step["requests"]:
                report["aborted"] = "every request of the step failed, warm-up included"
                break
    except (KeyboardInterrupt, processes.Stopped):
        report["interrupted"] = True
    report["finished_at"] = _now()
    report["passed"] = reports.passed(report["steps"], settings.max_error_rate)
    if llm:
        report["token_methods"] = reports.methods(report["steps"])
        report["output_lower_bound"] = any(report["token_methods"].get(m) for m in LOWER_BOUND_METHODS)
    return report


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------------------------------- CLI


def _shape(text: str) -> tuple[int, int]:
    if text in SHAPES:
        return SHAPES[text]
    try:
        inputs, outputs = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected IN x OUT tokens such as 32x128, got {text!r}") from None
    if inputs < 1 or outputs < 1:
        raise argparse.ArgumentTypeError(f"token counts must be positive, got {text!r}")
    return inputs, outputs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Load-test a SageMaker endpoint or an HTTP URL: throughput and latency per concurrency, "
                    "or draw saved runs side by side with --compare.",
        epilog="Exit status: 0 error rate within --max-error-rate in every step, 1 exceeded, 2 usage error, "
               "3 target unusable (unreachable, no credentials, every warm-up request failed), 130 interrupted.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="HTTP target, e.g. http://127.0.0.1:8080/invocations")
    where.add_argument("--endpoint", help="SageMaker endpoint name (credentials and region from the usual chain)")
    where.add_argument("--compare", nargs="+", type=Path, metavar="REPORT_JSON",
                       help="draw saved report.json files into one picture (needs --out); sends no traffic")
    parser.add_argument("--region", help="AWS region for --endpoint (default: the configured one)")
    parser.add_argument("--kind", choices=("llm", "sentiment"), default="llm",
                        help="llm: LMI text generation requests; sentiment: batches of texts")
    parser.add_argument("--shape", type=_shape, default=None, metavar="INxOUT",
                        help="llm request shape in tokens; the recipe's are 32x128 and 256x32 (default 32x128)")
    parser.add_argument("--input-tokens", type=positive_int, help="llm prompt length (overrides --shape)")
    parser.add_argument("--output-tokens", type=positive_int,
                        help="llm max_new_tokens, always sent (overrides --shape)")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="sentiment texts per request")
    parser.add_argument("--stream", action="store_true",
                        help="llm: ask LMI for its token stream (\"stream\": true; SageMaker "
                             "InvokeEndpointWithResponseStream, chunked HTTP for --url) and report time to first "
                             "token and inter-token latency; needs rolling batch in the container")
    parser.add_argument("--chat", action="store_true",
                        help="llm: send the OpenAI-compatible chat form (messages, max_tokens), which LMI's vLLM "
                             "service (0.33+) answers as Chat Completions")
    parser.add_argument("--tokenizer", metavar="DIR",
                        help="count tokens with this Hugging Face tokenizer where LMI does not report them "
                             "(default: the larger of token ids and whitespace words, a lower bound)")
    parser.add_argument("--lmi-version", metavar="VERSION",
                        help="the endpoint's falcon.lmi_version: where it answers \"details\": true (0.33+ vLLM, "
                             "--batching rolling_paged) the load test asks for it and counts LMI's own "
                             "details.generated_tokens")
    parser.add_argument("--batching", default="rolling_paged", choices=("dynamic", "rolling", "rolling_paged"),
                        help="the endpoint's falcon.batching, with --lmi-version")
    parser.add_argument("--concurrency", type=positive_int_list, default=[1], metavar="N[,N...]",
                        help="concurrent clients per step; a list sweeps, e.g. 1,4,16,32")
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument("--requests", type=positive_int, metavar="N",
                        help="measured requests per step, all clients together (default: 10 per client)")
    amount.add_argument("--duration", type=positive(float), metavar="SECONDS",
                        help="measure each step for this long instead of a request count")
    parser.add_argument("--warmup", type=non_negative_int, default=1, metavar="N",
                        help="unmeasured requests per client before each step")
    parser.add_argument("--timeout", type=positive(float), default=60.0, metavar="SECONDS",
                        help="per request; SageMaker real-time invocations stop at 60 s")
    parser.add_argument("--max-error-rate", type=fraction, default=0.01, metavar="FRACTION",
                        help="exit 1 when any step's errors / requests exceeds this")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="write report.json, report.csv and report.png (compare.png with --compare)")
    parser.add_argument("--label", help="name of this run in tables and pictures (default: target and shape)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--retries", type=non_negative_int, default=0, metavar="N",
                        help="send a throttled request (429, or SageMaker's ModelError with OriginalStatusCode 429, "
                             "or ThrottlingException) again up to N times, after the server's retry_after_s or "
                             "1, 2, 4 ... s; 0 shows throttling as it happens")
    return parser


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations argparse cannot express; parser.error exits with status 2."""
    if args.compare:
        if not args.out:
            parser.error("--compare needs --out DIR for the picture")
        return
    if args.kind == "sentiment" and (args.shape or args.input_tokens or args.output_tokens):
        parser.error("--shape, --input-tokens and --output-tokens apply to --kind llm")
    if args.kind == "sentiment" and (args.stream or args.chat):
        parser.error("--stream and --chat apply to --kind llm")
    if args.kind == "sentiment" and args.tokenizer:
        parser.error("--tokenizer applies to --kind llm; sentiment output is counted in labels")
    if args.region and not args.endpoint:
        parser.error("--region applies to --endpoint")
    if args.lmi_version and args.kind != "llm":
        parser.error("--lmi-version applies to --kind llm")
    if args.lmi_version:
        from inference.llm.lmi.versions import VERSIONS

        if args.lmi_version not in VERSIONS:
            parser.error(f"--lmi-version {args.lmi_version}: one of {', '.join(VERSIONS)}")


def _draw(runs: list[dict], path: Path) -> str:
    try:
        return f"wrote {reports.draw(runs, path)}"
    except ImportError:
        return f"no picture: matplotlib is not installed (pip install matplotlib); skipped {path}"


def _compare(paths: Sequence[Path], out: Path) -> int:
    try:
        runs = [reports.load_report(path) for path in paths]
    except ValueError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    seen: set[str] = set()
    for index, (path, run_report) in enumerate(zip(paths, runs, strict=True)):
        label = run_report.get("label") or Path(path).parent.name or f"run {index + 1}"
        if label in seen:  # one legend entry per run, even for two runs against the same target
            label = f"{label} ({index + 1})"
        seen.add(label)
        run_report["label"] = label
        print(reports.format_table(run_report) + "\n")
    print(_draw(runs, out / "compare.png"), file=sys.stderr)
    return EXIT_OK


def _default_label(target: Target) -> str:
    described = target.describe()
    return described.get("endpoint") or urlsplit(described.get("url", "")).netloc


def main(argv: list[str] | None = None, target: Target | None = None) -> int:
    """The command line; `target` replaces the one --url/--endpoint would build (tests pass a stubbed one)."""
    try:
        return _main(argv, target)
    except processes.Stopped as stopped:  # before the run began (loading a tokenizer, probing the target)
        print(f"{PROG}: stopped before the first step", file=sys.stderr)
        return stopped.exit_status


def _main(argv: list[str] | None, target: Target | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _check_args(parser, args)
    except SystemExit as exit_:  # --help, or a usage error already printed by argparse
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    if args.compare:
        return _compare(args.compare, args.out)

    try:
        counter = TokenizerCounter(args.tokenizer) if args.tokenizer else WordCounter()
    except (OSError, ValueError) as error:
        print(f"{PROG}: error: --tokenizer {args.tokenizer}: {_one_line(str(error))}", file=sys.stderr)
        return EXIT_USAGE
    if args.kind == "llm":
        inputs, outputs = args.shape or SHAPES["32x128"]
        details = False
        if args.lmi_version:
            from inference.llm.lmi.requests import details_supported

            details = details_supported(args.lmi_version, args.batching)
        workload = llm_workload(args.input_tokens or inputs, args.output_tokens or outputs, counter, args.stream,
                                args.chat, details=details and not args.chat)
    else:
        workload = sentiment_workload(args.batch_size)

    try:
        if target is None:
            target = (HttpTarget(args.url, args.timeout, stream=args.stream) if args.url else
                      SageMakerTarget(args.endpoint, args.region, args.timeout,
                                      max_connections=max(args.concurrency), stream=args.stream))
        target.probe()
    except ValueError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except TargetError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_TARGET

    settings = RunSettings(
        concurrencies=args.concurrency,
        requests=args.requests,
        duration=args.duration,
        warmup=args.warmup,
        max_error_rate=args.max_error_rate,
        progress=not args.no_progress,
        label=args.label or _default_label(target),
        retries=args.retries,
    )
    try:
        report = run(target, workload, settings, counter.name)
    finally:
        target.close()

    print(reports.format_table(report))
    if args.out:
        for path in reports.write_reports(report, args.out):
            print(f"wrote {path}", file=sys.stderr)
        print(_draw([report], args.out / "report.png"), file=sys.stderr)
    if report.get("aborted"):
        first = next((detail for step in report["steps"] for detail in step["error_examples"].values()), "")
        print(f"{PROG}: error: the target failed every request ({first}); stopped", file=sys.stderr)
        return EXIT_TARGET
    if report["interrupted"]:
        print(f"{PROG}: interrupted; the report holds the steps that finished", file=sys.stderr)
        return EXIT_INTERRUPTED if processes.received() is None else processes.exit_status(processes.received())
    if not report["passed"]:
        worst = max(report["steps"], key=lambda step: step["error_rate"])
        print(f"{PROG}: error rate {worst['error_rate']:.1%} with {worst['concurrency']} concurrent clients is "
              f"over --max-error-rate {settings.max_error_rate:.1%}", file=sys.stderr)
        return EXIT_ERROR_RATE
    return EXIT_OK


if __name__ == "__main__":
    processes.install_stop_handlers()  # first: SIGTERM ends a run as Ctrl-C does, and a repeat cannot cut the report
    processes.finish(main())
