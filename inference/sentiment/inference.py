"""The tweet-sentiment handler, in SageMaker's PyTorch handler contract; our server's request and response library.

The hooks: `model_fn` once per worker, then `input_fn` -> `predict_fn` -> `output_fn` per request. Our server
(`inference/sentiment/server`) decodes, predicts and encodes through them; the retired TorchServe image
(`sentiment.runtime=dlc`, issue 43) imported this file as the archive's `code/inference.py`. It still imports
nothing from this repository: only the standard library, torch and transformers (and the toolkit's error type
when it is there).

Request (Content-Type `application/json`; a `charset=utf-8` parameter is fine, a missing type means JSON):
    {"inputs": "one text"}  or  {"inputs": ["text", ...]}  [, "parameters": {"top_k": N}]
Response (`application/json`): a list with one entry per input, in input order, also for a single string
(the shape Hugging Face pipelines return for a list). Each entry is `{"label": ..., "score": ...}` with the
best label, or, when `top_k` is given, a list of the N best such objects, best first. Labels are
lowercase (`negative`, `neutral`, `positive`).

Client mistakes raise `ClientError`, a subclass of the toolkit's `GenericInferenceToolkitError`, so our server
(and SageMaker's toolkit) answers with its 4xx status; its message (the first line of the response body) is one
line of JSON, `{"error": "...", "status": N}`. 400 malformed body or shape, 406 unacceptable Accept, 413 too many
texts or a text too long, 415 content type, 422 `top_k` out of range. The worker and the model are untouched.

Limits come from the environment: `MAX_BATCH` (64 texts), `MAX_TEXT_CHARS` (5000 characters per text),
`MAX_TOP_K` (default and ceiling: the number of labels). Threads: `OMP_NUM_THREADS` if set, else the CPUs
this process may use divided by `SAGEMAKER_MODEL_SERVER_WORKERS` (default 1), so workers don't oversubscribe.

Speed: the texts of a request are sorted by token length and split into buckets, each padded only to its own
longest text, so short texts don't pay for a long neighbour (same numbers as one padded batch). Where to split
is planned (`plan_buckets`): fewest padded tokens, counting each forward pass as `PASS_COST_TOKENS` more,
because a pass has a fixed cost (RoBERTa-base, bf16, 2 vCPUs: a batch of 8 mixed-length texts took 187 ms
planned, 264 ms as one bucket, 281 ms one text per pass). Precision (fp32, bf16, int8, ONNX Runtime) is our
server's choice, behind the accuracy gate (`inference.sentiment.precision`).

The hooks take exactly the toolkit's arguments: it passes a trailing `context` to any hook that declares one
more parameter, so optional extras would silently receive it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

try:  # Present in the SageMaker serving containers; its status code is what the toolkit answers with.
    from sagemaker_inference.errors import GenericInferenceToolkitError as _ToolkitError
except ImportError:  # Local runs and tests: the same constructor and attributes.

    class _ToolkitError(Exception):
        """Stand-in for `sagemaker_inference.errors.GenericInferenceToolkitError`."""

        def __init__(self, status_code, message=None, phrase=None):
            message = message or "Invalid Request"
            phrase = phrase or message
            self.status_code = status_code
            self.message = message
            self.phrase = phrase
            super().__init__(status_code, message, phrase)


JSON = "application/json"
DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_TEXT_CHARS = 5000
# tweet_eval's order; used when a checkpoint only carries the generic LABEL_0.. names.
SENTIMENT_LABELS = ("negative", "neutral", "positive")
# Models that number positions from padding_idx + 1, so the last two embedding slots are not usable lengths.
_PADDING_OFFSET_MODELS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text"}
_GENERIC_LABEL = re.compile(r"^label_\d+$")
# What one more forward pass costs, in padded tokens: the bucket plan's price for a split (measured: 16 to 64
# gave the same speed for RoBERTa-base in bf16 on 2 vCPUs; 0 runs every text alone, a very large value one bucket).
PASS_COST_TOKENS = 32
# The most texts one bucket holds, which also bounds the plan's work (requests may carry up to MAX_BATCH texts).
MAX_BUCKET_TEXTS = 64
_WARMUP_TEXT = "Warm-up text so the first real request does not pay for kernel selection."


class ClientError(_ToolkitError):
    """A request the client got wrong: the toolkit answers `status_code` with a one-line JSON message."""

    def __init__(self, status_code: int, error: str):
        self.error = error
        body = json.dumps({"error": error, "status": status_code}, ensure_ascii=True)
        super().__init__(status_code, body, HTTPStatus(status_code).phrase)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Limits:
    """Request limits, read from the environment on each call so a test or a restart can change them."""

    max_batch: int = DEFAULT_MAX_BATCH
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_top_k: int | None = None  # None: the number of labels

    @classmethod
    def from_env(cls) -> Limits:
        return cls(
            max_batch=_env_int("MAX_BATCH", DEFAULT_MAX_BATCH),
            max_text_chars=_env_int("MAX_TEXT_CHARS", DEFAULT_MAX_TEXT_CHARS),
            max_top_k=_env_int("MAX_TOP_K", None),
        )


@dataclass(frozen=True)
class Request:
    """A validated request: the texts in order, and top_k (None: best label only, as an object)."""

    texts: list[str]
    top_k: int | None = None


@dataclass(frozen=True)
class SentimentModel:
    """What `model_fn` hands to `predict_fn`."""

    model: Any
    tokenizer: Any
    labels: tuple[str, ...]
    max_length: int
    threads: int


def _env_int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"environment variable {name}={raw!r} must be at least 1")
    return value


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # honours container CPU sets
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_count() -> int:
    """Intra-op threads for this worker: OMP_NUM_THREADS, else usable CPUs / model server workers."""
    explicit = _env_int("OMP_NUM_THREADS", None)
    if explicit:
        return explicit
    workers = _env_int("SAGEMAKER_MODEL_SERVER_WORKERS", 1) or 1
    return max(1, _usable_cpus() // workers)


def label_names(id2label: dict) -> tuple[str, ...]:
    """Lowercase label names in class-index order; generic LABEL_i names of a 3-class head become sentiments."""
    names = tuple(str(id2label[key]).strip().lower() for key in sorted(id2label, key=int))
    if len(names) == len(SENTIMENT_LABELS) and all(_GENERIC_LABEL.match(name) for name in names):
        return SENTIMENT_LABELS
    return names


def max_input_length(tokenizer, config) -> int:
    """Longest token sequence both the tokenizer and the position embeddings allow."""
    limits = []
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < 1_000_000:  # unset means ~1e30
        limits.append(tokenizer_limit)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        if getattr(config, "model_type", "") in _PADDING_OFFSET_MODELS:
            positions -= (getattr(config, "pad_token_id", None) or 0) + 1
        limits.append(positions)
    return min(limits) if limits else 512


def model_fn(model_dir):
    """Load the tokenizer and classifier saved at the archive root, set threads, and warm up once."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    Limits.from_env()  # a bad limit should stop the worker at start-up, not fail every request
    threads = thread_count()
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    loaded = SentimentModel(
        model=model,
        tokenizer=tokenizer,
        labels=label_names(model.config.id2label),
        max_length=max_input_length(tokenizer, model.config),
        threads=threads,
    )
    predict_fn(Request([_WARMUP_TEXT, "ok"]), loaded)
    return loaded


def _media_type(header) -> tuple[str, dict[str, str]]:
    """`application/json; charset=UTF-8` -> ("application/json", {"charset": "utf-8"})."""
    main, *params = str(header).split(";")
    parsed = {}
    for param in params:
        key, _, value = param.partition("=")
        parsed[key.strip().lower()] = value.strip().strip('"').lower()
    return main.strip().lower(), parsed


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def input_fn(request_body, request_content_type):
    """Decode and validate a JSON request into a `Request`; anything wrong is a `ClientError`."""
    limits = Limits.from_env()
    if request_content_type:
        media, params = _media_type(request_content_type)
        if media != JSON:
            raise ClientError(415, f"content type {_short(str(request_content_type))} is not supported; "
                                   f"send {JSON}")
        if params.get("charset", "utf-8") not in ("utf-8", "utf8"):
            raise ClientError(415, f"charset {_short(params['charset'])} is not supported; send utf-8")
    if isinstance(request_body, bytearray | memoryview):
        request_body = bytes(request_body)
    if isinstance(request_body, bytes):
        try:
            request_body = request_body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ClientError(400, f"request body is not valid UTF-8 (byte {error.start})") from None
    if not isinstance(request_body, str) or not request_body.strip():
        raise ClientError(400, "request body is empty; send {\"inputs\": \"text\"} or {\"inputs\": [\"text\", ...]}")
    try:
        payload = json.loads(request_body)
    except (ValueError, RecursionError) as error:
        detail = f": {error.msg} at line {error.lineno} column {error.colno}" if isinstance(
            error, json.JSONDecodeError) else ""
        raise ClientError(400, f"request body is not valid JSON{detail}") from None
    if not isinstance(payload, dict):
        raise ClientError(400, f"request body must be a JSON object with \"inputs\", got {_type_name(payload)}")
    if "inputs" not in payload:
        raise ClientError(400, "missing \"inputs\": send a text or a list of texts")
    texts = _texts(payload["inputs"], limits)
    return Request(texts=texts, top_k=_top_k(payload.get("parameters"), limits))


def _texts(inputs: Any, limits: Limits) -> list[str]:
    if isinstance(inputs, str):
        inputs = [inputs]
    elif not isinstance(inputs, list):
        raise ClientError(400, f"\"inputs\" must be a string or a list of strings, got {_type_name(inputs)}")
    if not inputs:
        raise ClientError(400, "\"inputs\" is empty: send at least one text")
    if len(inputs) > limits.max_batch:
        raise ClientError(413, f"\"inputs\" has {len(inputs)} texts; at most {limits.max_batch} per request")
    for index, text in enumerate(inputs):
        if not isinstance(text, str):
            raise ClientError(400, f"\"inputs\"[{index}] must be a string, got {_type_name(text)}")
        if not text:
            raise ClientError(400, f"\"inputs\"[{index}] is an empty string")
        if len(text) > limits.max_text_chars:
            raise ClientError(413, f"\"inputs\"[{index}] has {len(text)} characters; "
                                   f"at most {limits.max_text_chars}")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate escaped in the JSON, e.g. "\ud800"
                raise ClientError(400, f"\"inputs\"[{index}] holds an unpaired surrogate, not text") from None
    return inputs


def _top_k(parameters: Any, limits: Limits) -> int | None:
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise ClientError(400, f"\"parameters\" must be an object, got {_type_name(parameters)}")
    unknown = sorted(set(parameters) - {"top_k"})
    if unknown:
        raise ClientError(400, f"unknown parameter {_short(unknown[0])}; supported: top_k")
    top_k = parameters.get("top_k")
    if top_k is None:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise ClientError(400, f"\"top_k\" must be an integer, got {_type_name(top_k)}")
    if top_k < 1 or (limits.max_top_k is not None and top_k > limits.max_top_k):
        ceiling = "the number of labels" if limits.max_top_k is None else limits.max_top_k
        raise ClientError(422, f"\"top_k\" must be between 1 and {ceiling}, got {_short(top_k)}")
    return top_k  # the ceiling set by the model's labels is checked in predict_fn


def plan_buckets(lengths: list[int], pass_cost: int = PASS_COST_TOKENS,
                 max_texts: int = MAX_BUCKET_TEXTS) -> list[tuple[int, int]]:
    """Split token lengths sorted ascending into buckets [start, end) of at most `max_texts`: the fewest padded
    tokens plus `pass_cost` per bucket (each bucket pads to its last, longest text). Dynamic programming over
    the split points."""
    count = len(lengths)
    best = [0] + [None] * count  # best[end]: the cheapest plan of lengths[:end]
    split = [0] * (count + 1)
    for end in range(1, count + 1):
        for start in range(max(0, end - max_texts), end):
            cost = best[start] + (end - start) * lengths[end - 1] + pass_cost
            if best[end] is None or cost < best[end]:
                best[end], split[end] = cost, start
    buckets, end = [], count
    while end:
        buckets.append((split[end], end))
        end = split[end]
    return buckets[::-1]


def predict_fn(data, model):
    """Forward passes over planned length-sorted buckets (dynamic padding per bucket), truncation to the model's
    limit."""
    if not isinstance(data, Request):
        raise TypeError(f"predict_fn expects the Request from input_fn, got {type(data).__name__}")
    top_k = data.top_k
    if top_k is not None and top_k > len(model.labels):
        raise ClientError(422, f"\"top_k\" must be between 1 and {len(model.labels)}, got {_short(top_k)}")
    return predict_encoded(encode(data.texts, model), top_k, model)


def encode(texts, model) -> dict:
    """Token ids (and masks) per text, truncated to the model's limit: what `predict_encoded` takes. A server
    counts a request's tokens from it before queueing, and concatenates several requests' encodings."""
    return dict(model.tokenizer(texts, truncation=True, max_length=model.max_length))


def predict_encoded(encoded: dict, top_k, model):
    """predict_fn after tokenizing: forward passes over planned length-sorted buckets of `encoded`."""
    import torch

    labels = model.labels
    # Sort by length and run buckets of similar length: each bucket pads only to its own longest text.
    order = sorted(range(len(encoded["input_ids"])), key=lambda index: len(encoded["input_ids"][index]))
    logits = [None] * len(order)
    with torch.inference_mode():
        for start, end in plan_buckets([len(encoded["input_ids"][index]) for index in order]):
            bucket = order[start:end]
            batch = model.tokenizer.pad({key: [values[index] for index in bucket] for key, values in encoded.items()},
                                        return_tensors="pt")
            for index, row in zip(bucket, model.model(**batch).logits, strict=True):
                logits[index] = row
    scores, indices = torch.stack(logits).float().softmax(dim=-1).topk(top_k or 1, dim=-1)
    ranked = [
        [{"label": labels[index], "score": score} for index, score in zip(row_indices, row_scores, strict=True)]
        for row_indices, row_scores in zip(indices.tolist(), scores.tolist(), strict=True)
    ]
    return ranked if top_k is not None else [row[0] for row in ranked]


def _is_zero(quality: str) -> bool:
    try:
        return float(quality) == 0
    except ValueError:
        return False


def _accepts_json(accept) -> bool:
    if not accept:
        return True
    for media_range in str(accept).split(","):
        media, params = _media_type(media_range)
        if media in (JSON, "application/*", "*/*") and not _is_zero(params.get("q", "1")):
            return True
    return False


def output_fn(prediction, accept):
    """Serialize as JSON; returns (body, content type) so the toolkit labels the response correctly."""
    if not _accepts_json(accept):
        raise ClientError(406, f"cannot answer with {_short(str(accept))}; responses are {JSON}")
    return json.dumps(prediction, separators=(",", ":")), JSON
