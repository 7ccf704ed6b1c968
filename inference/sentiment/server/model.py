"""Load the model from a SageMaker model directory and answer a batch of requests in one pass.

`model.tar.gz` from `training.package` (or SageMaker training) loads as is: the tokenizer and classifier at its
root are read exactly as the handler's `model_fn` reads them. A `code/` folder, which archives packaged for the
retired TorchServe image carry (handler, handler service, requirements, wheels), is not used: the image carries our
handler (`inference.sentiment.inference`) and every Python dependency, so nothing is imported from the archive or
installed at start-up.

The engine and precision are chosen here, on the CPU that serves, before `/ping` answers: `load` runs
`inference.sentiment.calibration`, which checks every pair the archive carries and this CPU runs against torch fp32
on held-out texts, times the passing ones and keeps the fastest loaded (an override, `SENTIMENT_PRECISION`, skips
the choice but not the check: a pair that does not answer like fp32 here is refused with its figures). One log line
says the choice, every pair's figures and the CPU. An ONNX Runtime pair sits behind the handler's forward-pass seam
(`model.model(**batch).logits`, `inference.sentiment.onnx_engine.OnnxClassifier`), so nothing below this module
knows which engine runs; a pair whose session cannot be built is measured as "cannot run" and not chosen.

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

from inference.sentiment import calibration
from inference.sentiment import inference as handler

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


def load(model_dir: Path, *, threads: int, precision_override: str | None = None, replicas: int = 1,
         calibration_seconds: float = calibration.DEFAULT_BUDGET_S) -> LoadedModel:
    """Tokenizer and classifier from the directory's root, at the pair the calibration chose on this CPU, warmed up
    by it (`replicas`: the replica threads that will call it; an ONNX Runtime pair gives each its own session)."""
    import torch

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ModelDirError(f"{model_dir}: no config.json at its root, not a saved model")
    started = time.perf_counter()
    handler.Limits.from_env()  # a bad limit stops the worker at start, not every request
    torch.set_num_threads(threads)
    done = calibration.calibrate(model_dir, override=precision_override, threads=threads, replicas=replicas,
                                 budget_s=calibration_seconds)
    LOG.info("%s", done.line)
    return LoadedModel(done.sentiment, done.chosen, time.perf_counter() - started, model_dir)


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
