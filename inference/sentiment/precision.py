"""STUB for branch issue-21-server only: the precision interface the server calls at model load.

The real module (gate, record written by training.package, int8 through torchao) comes from branch
`issue-21-precision`; at merge, take theirs and drop this file. This stub implements just the agreed interface
for fp32 and bf16, with no gate of its own:

- `PRECISIONS`: every precision a record or an override may name.
- `RECORD`: the file at the model directory's root that holds the recorded choice.
- `choose(model_dir, override)`: the override if given, else the recorded choice, else "fp32".
- `apply(model, precision)`: the model converted (bf16 weights), with oneDNN's bf16 fast-math mode set for bf16.
"""

from __future__ import annotations

import json
from pathlib import Path

PRECISIONS = ("fp32", "bf16", "int8")
RECORD = "precision.json"
_STUB_SUPPORTED = ("fp32", "bf16")


class PrecisionRefused(ValueError):
    """An override that failed the accuracy gate; the message carries the measured figures."""


def _check(precision: str, where: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"{where}={precision!r} is not a precision; allowed: {', '.join(PRECISIONS)}")
    if precision not in _STUB_SUPPORTED:
        raise ValueError(f"{where}={precision!r}: this build (precision stub) supports only "
                         f"{', '.join(_STUB_SUPPORTED)}")
    return precision


def choose(model_dir: Path, override: str | None) -> str:
    """The precision to serve: the override, else the record's choice, else fp32 (no record)."""
    if override:
        return _check(override.strip().lower(), "SENTIMENT_PRECISION")
    record = Path(model_dir) / RECORD
    if not record.is_file():
        return "fp32"
    try:
        chosen = json.loads(record.read_text())["precision"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{record}: not a precision record ({error})") from None
    return _check(str(chosen), f"{RECORD} precision")


def apply(model, precision: str):
    """The model at `precision`: bf16 weights for bf16 (oneDNN's bf16 fast math for any fp32 matmul left)."""
    import torch

    _check(precision, "precision")
    if precision == "bf16":
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        return model.to(torch.bfloat16)
    return model
