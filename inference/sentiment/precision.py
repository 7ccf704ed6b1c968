"""The (engine, precision) pairs a model can be served at, the accuracy gate's rule and record, and how each pair is
loaded and run.

Which pair serves is chosen on the serving CPU at start (`inference.sentiment.calibration`); this module holds what
that pass and the packaging gate (`inference.sentiment.accuracy_check`) share:

- the gate's rule (`Figures.passed`): best labels agree with fp32 on at least `MIN_AGREEMENT` of the held-out texts
  and no class probability moves by more than `TOLERANCE`;
- the record `training.package` writes to `precision.json` (`make_record`, `read_record`): the packaging CPU's
  figures for every pair and its choice there, for the packaging report and the model registry. The server does
  not trust it: timings do not transfer between CPUs, and int8 accuracy depends on the CPU's kernels
  (`inference.sentiment.int8_target`);
- `parse_override`: `sentiment.precision` (SENTIMENT_PRECISION) as a pair name, or a ValueError naming the pairs;
- `activate(precision)`: oneDNN's math mode for a pair (process-wide: the calibration sets it before each call of a
  pair, and the served pair keeps its own);
- `apply`, `load_engine`: the torch model converted to a pair, or ONNX Runtime sessions on the archive's graph.

The pairs:
- `fp32`: the model as trained.
- `bf16`: bf16 weights (oneDNN's bf16 kernels: AMX/AVX512-BF16 on x86, BF16 instructions on Graviton3), and
  oneDNN's bf16 fast-math mode for any fp32 matmul left (`torch.backends.mkldnn.matmul.fp32_precision = "bf16"`,
  set at run time by `activate`, so a torch fp32 pair in the same process still runs fp32 kernels).
- `int8`: dynamic int8 of every Linear layer (int8 weights, activations quantized per batch) through torchao's
  `quantize_` (`Int8DynamicActivationInt8WeightConfig`), the maintained successor of
  `torch.ao.quantization.quantize_dynamic`.
- `onnx-fp32`, `onnx-int8`: ONNX Runtime (CPU execution provider) running the graphs `training.package` exported
  into the archive's `onnx/` folder (`inference.sentiment.onnx_export`: fp32, and int8 by ONNX Runtime's dynamic
  quantization with weights made for the endpoint's CPU), behind the handler's forward-pass seam
  (`inference.sentiment.onnx_engine.OnnxClassifier`). A pair runs only where its graph is in the model directory
  and onnxruntime is installed (`unavailable` says why not).
- `onnx-bf16-fastmath`: the fp32 graph with ONNX Runtime's bf16 fast math for MatMul
  (`mlas.enable_gemm_fastmath_arm64_bfloat16`), an aarch64 kernel for CPUs with bf16 instructions (Graviton3 and
  later): elsewhere ONNX Runtime ignores the option, so the pair runs only there (`cpu_reason`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from inference.sentiment import onnx_engine

PRECISIONS = ("fp32", "bf16", "int8", "onnx-fp32", "onnx-int8", "onnx-bf16-fastmath")
# The pairs ONNX Runtime runs (the others run on torch).
ONNX_PRECISIONS = tuple(onnx_engine.GRAPHS)
LABELS = {"fp32": "torch fp32", "bf16": "torch bf16 weights", "int8": "torch int8 (torchao dynamic)",
          "onnx-fp32": "ONNX Runtime fp32", "onnx-int8": "ONNX Runtime int8 (dynamic)",
          "onnx-bf16-fastmath": "ONNX Runtime fp32 graph, bf16 fast math (aarch64)"}
RECORD = "precision.json"
# The gate (issue 21): best labels agree on at least this share of the held-out sample...
MIN_AGREEMENT = 0.99
# ... and no class probability moves by more than this from fp32.
TOLERANCE = 0.05
OVERRIDE_ENV = "SENTIMENT_PRECISION"


class PrecisionRefused(ValueError):
    """An override that failed the accuracy gate; the message carries the measured figures."""


@dataclass(frozen=True)
class Figures:
    """What the gate measured for one precision against fp32 on the held-out sample."""

    precision: str
    agreement: float | None = None  # share of texts whose best label is fp32's
    max_change: float | None = None  # largest absolute change of any class probability
    ms_per_batch: float | None = None  # best of the gate's rounds on the packaging machine (what picks)
    error: str | None = None  # why it could not be measured (then it does not pass)
    ms_median: float | None = None  # median of the same rounds, for the reader: a busy machine shows here

    def passed(self, min_agreement: float = MIN_AGREEMENT, tolerance: float = TOLERANCE) -> bool:
        if self.error is not None or self.agreement is None or self.max_change is None:
            return False
        return self.agreement >= min_agreement and self.max_change <= tolerance

    def describe(self, min_agreement: float = MIN_AGREEMENT, tolerance: float = TOLERANCE) -> str:
        """One line, e.g. `bf16: labels agree 100.0% (need >= 99%), max probability change 0.0018 (allowed 0.05),
        61.2 ms per batch: PASS`."""
        if self.error is not None:
            return f"{self.precision}: not measured ({self.error}): FAIL"
        speed = "" if self.ms_per_batch is None else f", {self.ms_per_batch:.1f} ms per batch"
        if self.ms_median is not None:
            speed += f" (median {self.ms_median:.1f})"
        verdict = "PASS" if self.passed(min_agreement, tolerance) else "FAIL"
        return (f"{self.precision}: labels agree {self.agreement:.1%} (need >= {min_agreement:.0%}), max probability "
                f"change {self.max_change:.4f} (allowed {tolerance:g}){speed}: {verdict}")

    @classmethod
    def from_dict(cls, precision: str, data: dict) -> Figures:
        return cls(precision, data.get("agreement"), data.get("max_change"), data.get("ms_per_batch"),
                   data.get("error"), data.get("ms_median"))


def pick(figures: list[Figures], min_agreement: float = MIN_AGREEMENT, tolerance: float = TOLERANCE) -> str:
    """The fastest precision that passed; fp32 when none did or none was timed (fp32 is the reference)."""
    passing = [entry for entry in figures if entry.passed(min_agreement, tolerance) and entry.ms_per_batch is not None]
    if not passing:
        return "fp32"
    return min(passing, key=lambda entry: (entry.ms_per_batch, PRECISIONS.index(entry.precision))).precision


def make_record(figures: list[Figures], *, min_agreement: float = MIN_AGREEMENT, tolerance: float = TOLERANCE,
                **details) -> dict:
    """precision.json's content: the packaging machine's choice, which precisions passed there, their timings
    and the CPU they describe, the thresholds, and every precision's figures."""
    measured_on = details.get("measured_on") or {}
    if measured_on.get("bf16_instructions") is False:  # what the server would choose on this machine: no bf16
        figures_for_choice = [entry for entry in figures if entry.precision != "bf16"]
    else:
        figures_for_choice = figures
    return {
        "precision": pick(figures_for_choice, min_agreement, tolerance),
        "accuracy": {"passed": [entry.precision for entry in figures if entry.passed(min_agreement, tolerance)],
                     "failed": [entry.precision for entry in figures if not entry.passed(min_agreement, tolerance)]},
        "speed": {"measured_on": details.get("measured_on"),
                  "ms_per_batch": {entry.precision: entry.ms_per_batch for entry in figures
                                   if entry.ms_per_batch is not None and entry.error is None}},
        "gate": {"min_agreement": min_agreement, "max_probability_change": tolerance, **details},
        "figures": {entry.precision: {key: value for key, value in asdict(entry).items()
                                      if key != "precision" and value is not None}
                    | {"passed": entry.passed(min_agreement, tolerance)} for entry in figures},
    }


def read_record(model_dir: Path) -> dict | None:
    """The model directory's record, None when it has none; a record that does not parse stops the load."""
    path = Path(model_dir) / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        chosen = record["precision"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a precision record ({type(error).__name__}: {error})") from None
    if chosen not in PRECISIONS:
        raise ValueError(f"{path}: precision {chosen!r} is not one of {', '.join(PRECISIONS)}")
    return record


def parse_override(value: str) -> str:
    """SENTIMENT_PRECISION's value as a pair name; ValueError naming the setting and the allowed pairs."""
    return _check(value.strip().lower(), OVERRIDE_ENV)


def _check(precision: str, where: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"{where}={precision!r} is not a precision; allowed: {', '.join(PRECISIONS)} "
                         f"({'; '.join(f'{name}: {LABELS[name]}' for name in PRECISIONS)})")
    return precision


def label(precision: str) -> str:
    """The pair in words, engine and precision: `onnx-int8` -> `ONNX Runtime int8 (dynamic)`."""
    return LABELS.get(precision, precision)


def unavailable(model_dir: Path, precision: str) -> str | None:
    """Why this model directory cannot run `precision` here (None when it can): only ONNX Runtime pairs need
    anything beyond the weights (their graph in `onnx/`, and onnxruntime installed)."""
    if precision not in ONNX_PRECISIONS:
        return None
    return onnx_engine.missing_reason(model_dir, precision)


def cpu_reason(precision: str, cpu) -> str | None:
    """Why `precision` means nothing on this CPU (a `cpu_features.Bf16Support`), None where it does: ONNX Runtime's
    bf16 fast math exists on aarch64 with bf16 instructions only, and anywhere else it would measure onnx-fp32 again
    under another name. (torch bf16 is decided by its callers: the gate checks its accuracy on any CPU, emulated
    where there are no bf16 instructions; the calibration times only what this CPU runs natively.)"""
    if precision == "onnx-bf16-fastmath" and not (cpu.machine == "aarch64" and cpu.available):
        return (f"ONNX Runtime's bf16 fast math is an aarch64 kernel for CPUs with bf16 instructions; this CPU: "
                f"{cpu.evidence}")
    return None


def activate(precision: str) -> None:
    """Set the process-wide math mode a precision runs with (the gate switches between them in one process)."""
    import torch

    _check(precision, "precision")
    # none: torch's default (ONNX Runtime pairs leave torch at fp32: it only pads and ranks around them)
    torch.backends.mkldnn.matmul.fp32_precision = "bf16" if precision == "bf16" else "none"


def apply(model, precision: str):
    """The torch model at `precision` (bf16 weights, torchao dynamic int8, or as is), with the math mode set for it.
    ONNX Runtime pairs do not convert a torch model: `load_engine` builds them from the exported graph."""
    import torch

    if precision in ONNX_PRECISIONS:
        raise ValueError(f"{precision} runs on ONNX Runtime, not on a converted torch model: use load_engine")
    activate(precision)
    if precision == "bf16":
        return model.to(torch.bfloat16)
    if precision == "int8":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        quantize_(model, Int8DynamicActivationInt8WeightConfig())  # every nn.Linear, in place
    return model


def load_engine(model_dir: Path, precision: str, *, threads: int, replicas: int = 1,
                onnx_dir: Path | None = None):
    """What the handler calls as `model.model(**batch)` for `precision`, and the model's config: the torch
    classifier converted by `apply`, or ONNX Runtime sessions on the exported graph (`onnx_dir`: where the gate
    finds graphs exported beside a model directory; the archive's own `onnx/` otherwise)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    _check(precision, "precision")
    if precision in ONNX_PRECISIONS:
        activate(precision)
        path = onnx_engine.graph_path(model_dir, precision, onnx_dir)
        missing = onnx_engine.missing_reason(model_dir, precision, onnx_dir)
        if missing:
            raise RuntimeError(f"{precision}: {missing}")
        return (onnx_engine.OnnxClassifier(path, threads=threads, replicas=replicas,
                                           config=onnx_engine.SESSION_CONFIG.get(precision)),
                AutoConfig.from_pretrained(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    model = apply(model, precision)
    return model, model.config
