"""Load the model from a SageMaker model directory and answer a batch of requests in one pass.

`model.tar.gz` from `training.package` (or SageMaker training) loads as is: the tokenizer and classifier at its
root are read exactly as the handler's `model_fn` reads them. A `code/` folder, which archives packaged for the
retired TorchServe image carry (handler, handler service, requirements, wheels), is not used: the image carries our
handler (`inference.sentiment.inference`) and every Python dependency, so nothing is imported from the archive or
installed at start-up.

The engine and precision come from `inference.sentiment.precision.choose`: the fastest (engine, precision) pair that
passed the accuracy gate recorded in the model directory and that this CPU and archive run (bf16 only with bf16
instructions; ONNX Runtime only where the archive carries its exported graph), unless the endpoint overrides it
(`SENTIMENT_PRECISION`); torch fp32 for a model without a record. The server logs the choice and why. An ONNX
Runtime pair sits behind the handler's forward-pass seam (`model.model(**batch).logits`,
`inference.sentiment.onnx_engine.OnnxClassifier`), so nothing below this module knows which engine runs; if its
session cannot be built, a chosen (not overridden) ONNX Runtime pair gives way to the best torch pair, with a
warning line saying why.

Each request is tokenized once when it arrives (`encode`: its token count is what the queue budgets); the
requests of a batch then go through the handler's own forward-pass plan (`predict_encoded`: length-sorted
buckets, dynamic padding, the model's truncation limit) as one list of texts, asking for every label's score;
each request then gets its own slice, shaped as it asked (best label, or the `top_k` best). So a request's
answer is what the handler gives it alone, up to float rounding from padding to a different length.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.sentiment import inference as handler
from inference.sentiment import precision as precisions

LOG = logging.getLogger(__name__)
_WARMUP_TEXTS = ["Warm-up text so the first real request does not pay for kernel selection.", "ok"]


@dataclass(frozen=True)
class LoadedModel:
    sentiment: handler.SentimentModel
    precision: str
    load_seconds: float
    model_dir: Path


class ModelDirError(ValueError):
    """The model directory holds no model; one line for the user."""


def load(model_dir: Path, *, threads: int, precision_override: str | None = None, replicas: int = 1) -> LoadedModel:
    """Tokenizer and classifier from the directory's root, at the chosen pair, warmed up once (`replicas`: the
    replica threads that will call it; an ONNX Runtime pair gives each its own session)."""
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a loading bar per worker start is noise in the endpoint's log

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ModelDirError(f"{model_dir}: no config.json at its root, not a saved model")
    started = time.perf_counter()
    handler.Limits.from_env()  # a bad limit stops the worker at start, not every request
    chosen = precisions.choose(model_dir, precision_override)
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    try:
        sentiment = _ready(model_dir, chosen, tokenizer, threads, replicas)
    except Exception as error:
        if precision_override or chosen not in precisions.ONNX_PRECISIONS:
            raise
        fallback, why = precisions.choose_explained(model_dir, None, torch_only=True)
        LOG.warning("precision %s could not start (%s: %s); serving %s instead: %s", chosen, type(error).__name__,
                    str(error).splitlines()[0] if str(error) else "", fallback, why)
        chosen = fallback
        sentiment = _ready(model_dir, chosen, tokenizer, threads, replicas)
    return LoadedModel(sentiment, chosen, time.perf_counter() - started, model_dir)


def _ready(model_dir: Path, chosen: str, tokenizer, threads: int, replicas: int) -> handler.SentimentModel:
    """The handler's model object for one pair, after one warm-up pass through the handler."""
    model, config = precisions.load_engine(model_dir, chosen, threads=threads, replicas=replicas)
    sentiment = handler.SentimentModel(
        model=model, tokenizer=tokenizer, labels=handler.label_names(config.id2label),
        max_length=handler.max_input_length(tokenizer, config), threads=threads,
    )
    handler.predict_fn(handler.Request(_WARMUP_TEXTS), sentiment)
    return sentiment


def warm_up(loaded: LoadedModel) -> None:
    """One small forward pass: a replica's restart checks the shared model still answers."""
    handler.predict_fn(handler.Request(_WARMUP_TEXTS), loaded.sentiment)


def check_top_k(request: handler.Request, loaded: LoadedModel) -> None:
    """The ceiling the labels set on top_k, checked before the request joins a batch (predict_fn's own rule)."""
    count = len(loaded.sentiment.labels)
    if request.top_k is not None and request.top_k > count:
        raise handler.ClientError(422, f"\"top_k\" must be between 1 and {count}, got {request.top_k}")


@dataclass(frozen=True)
class Encoded:
    """A validated request with its texts already tokenized: its token count is what the queue budgets."""

    request: handler.Request
    encoding: dict
    tokens: int


def encode(request: handler.Request, loaded: LoadedModel) -> Encoded:
    """Tokenize a request once, before it is queued (the batch reuses the ids)."""
    encoding = handler.encode(request.texts, loaded.sentiment)
    return Encoded(request, encoding, sum(len(ids) for ids in encoding["input_ids"]))


def predict(requests: Sequence[Encoded | handler.Request], loaded: LoadedModel) -> list[Any]:
    """One answer per request, in order, from one forward-pass plan over all their texts (the handler's own
    `predict_encoded`, asking for every label's score); each request then gets its own slice."""
    labels = loaded.sentiment.labels
    items = [item if isinstance(item, Encoded) else encode(item, loaded) for item in requests]
    merged = {key: [row for item in items for row in item.encoding[key]] for key in items[0].encoding}
    ranked = handler.predict_encoded(merged, len(labels), loaded.sentiment)
    answers, start = [], 0
    for item in items:
        request = item.request
        rows = ranked[start:start + len(request.texts)]
        start += len(request.texts)
        answers.append([row[0] for row in rows] if request.top_k is None else [row[:request.top_k] for row in rows])
    return answers
