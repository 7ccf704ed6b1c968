"""Which numeric precision a model is served at: the gate's choice recorded at packaging, or a checked override.

`training.package` runs the accuracy gate (`inference.sentiment.accuracy_check`) on the model and writes its
result to `precision.json` at the archive's root: the fastest precision whose answers stay close to fp32 on a
held-out sample, with the figures measured for every precision. The server calls two functions at model load:

- `choose(model_dir, override)` (`choose_explained` adds why, for the start-up log): the override
  (`sentiment.precision`, passed as SENTIMENT_PRECISION) when the gate passed it, else the fastest precision that
  passed the gate and that the serving CPU runs (bf16 only with bf16 instructions, `inference.sentiment.cpu_features`),
  else fp32 (an archive packaged before the gate existed). An override that failed the gate raises
  `PrecisionRefused` with the measured figures.

The record keeps accuracy apart from speed: `accuracy.passed` holds for any CPU whose int8 kernels do not saturate
the int8 graph's weights (made for the endpoint's CPU: `inference.sentiment.int8_target`; bf16 is computed exactly
the same way, only slower, where a CPU lacks the instructions), `speed` only for the kind of CPU it was timed on
(`speed.measured_on`: machine and bf16 instructions). The server ranks by those timings when they come from its
own kind of CPU; otherwise by `DEFAULT_ORDER` (below; int8 on a CPU without bf16 instructions is only taken where
it was measured on such a CPU).
- `apply(model, precision)`: the model converted to that precision, with the process's math mode set for it.
- `process_environment(precision)`: variables the server process must have before it imports torch (the server
  sets them in its own environment first).

The precisions:
- `fp32`: the model as trained.
- `bf16`: bf16 weights (oneDNN's bf16 kernels: AMX/AVX512-BF16 on x86, BF16 instructions on Graviton3), and
  oneDNN's bf16 fast-math mode for any fp32 matmul left: through torch (`torch.backends.mkldnn.matmul.
  fp32_precision = "bf16"`) and, for the server's workers, `DNNL_DEFAULT_FPMATH_MODE=BF16` as AWS's Graviton
  images set it. oneDNN reads that variable once, when torch loads it (ONEDNN_VERBOSE shows no `attr-fpmath:bf16`
  when it is set after `import torch`), so the server puts it in its own environment before it imports torch.
  Per model, not in the image for every model, so a model whose gate kept fp32 really runs fp32.
- `int8`: dynamic int8 of every Linear layer (int8 weights, activations quantized per batch) through torchao's
  `quantize_` (`Int8DynamicActivationInt8WeightConfig`), the maintained successor of
  `torch.ao.quantization.quantize_dynamic`.
- `onnx-fp32`, `onnx-int8`: ONNX Runtime (CPU execution provider) running the graphs `training.package` exported
  into the archive's `onnx/` folder (`inference.sentiment.onnx_export`: fp32, and int8 by ONNX Runtime's dynamic
  quantization), behind the handler's forward-pass seam (`inference.sentiment.onnx_engine.OnnxClassifier`). A pair
  is a candidate only where its graph is in the model directory and onnxruntime is installed: an archive packaged
  before the export, or whose export failed, serves on torch.

Each name is an (engine, precision) pair; `LABELS` says which in words. Where ONNX Runtime goes in the default
order (no timing from this kind of CPU, e.g. every Graviton endpoint of a model packaged on x86):
- CPU with bf16 instructions: onnx-int8, bf16, onnx-fp32, fp32. The one such CPU measured (AMD EPYC Zen 4, issue
  35: RoBERTa-base, 8 x 48 tokens, 2 threads) ran ONNX Runtime int8 in 67 ms, torch bf16 in 98, ONNX Runtime fp32
  in 158 and torch fp32 in 362. Every CPU with bf16 instructions also has int8 dot products (AVX512-VNNI on x86,
  SDOT and I8MM on Graviton3), which ONNX Runtime's int8 kernels use.
- CPU without: onnx-fp32, fp32. ONNX Runtime fp32 was 1.64x torch fp32 on a Zen 2 (AVX2 only), its int8 only
  1.01x its fp32 there (no VNNI), so int8's accuracy cost buys nothing measured: like torch int8, ONNX Runtime int8
  is taken there only where the record timed it on that kind of CPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from inference.sentiment import onnx_engine
from inference.sentiment.cpu_features import Bf16Support, this_cpu

PRECISIONS = ("fp32", "bf16", "int8", "onnx-fp32", "onnx-int8")
# The pairs ONNX Runtime runs (the others run on torch).
ONNX_PRECISIONS = tuple(onnx_engine.GRAPHS)
LABELS = {"fp32": "torch fp32", "bf16": "torch bf16 weights", "int8": "torch int8 (torchao dynamic)",
          "onnx-fp32": "ONNX Runtime fp32", "onnx-int8": "ONNX Runtime int8 (dynamic)"}
RECORD = "precision.json"
# The gate (issue 21): best labels agree on at least this share of the held-out sample...
MIN_AGREEMENT = 0.99
# ... and no class probability moves by more than this from fp32.
TOLERANCE = 0.05
FPMATH_ENV = "DNNL_DEFAULT_FPMATH_MODE"
OVERRIDE_ENV = "SENTIMENT_PRECISION"
# The serving order where the record holds no timing from this kind of CPU (see the module's docstring).
DEFAULT_ORDER = {True: ("onnx-int8", "bf16", "onnx-fp32", "fp32"), False: ("onnx-fp32", "fp32")}


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
    """precision.json's content: the packaging machine's choice, which precisions passed (any CPU), their timings
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


def passed(record: dict) -> list[str]:
    """The precisions that passed the record's accuracy gate (fp32, the reference, always does)."""
    if "accuracy" in record:
        names = list(record["accuracy"].get("passed", []))
    else:  # a record from before accuracy and speed were apart: its figures say which passed
        gate = record.get("gate", {})
        names = [name for name, data in record.get("figures", {}).items() if Figures.from_dict(name, data).passed(
            gate.get("min_agreement", MIN_AGREEMENT), gate.get("max_probability_change", TOLERANCE))]
    return [name for name in PRECISIONS if name == "fp32" or name in names]


def _speeds_for(record: dict, cpu: Bf16Support) -> dict[str, float] | None:
    """The record's timings when they were taken on this kind of CPU (machine and bf16 instructions), else None."""
    speed = record.get("speed") or {}
    measured_on = speed.get("measured_on") or {}
    if measured_on.get("machine") != cpu.machine or measured_on.get("bf16_instructions") != cpu.available:
        return None
    return speed.get("ms_per_batch") or None


def choose(model_dir: Path, override: str | None, cpu: Bf16Support | None = None) -> str:
    """The precision to serve (see `choose_explained`)."""
    return choose_explained(model_dir, override, cpu)[0]


def choose_explained(model_dir: Path, override: str | None, cpu: Bf16Support | None = None, *,
                     torch_only: bool = False) -> tuple[str, str]:
    """(precision, why): a gate-passed override; else the fastest gate-passed pair this CPU and model directory
    run; else fp32 (`torch_only`: among torch's pairs, when ONNX Runtime could not start)."""
    cpu = this_cpu() if cpu is None else cpu
    record = read_record(model_dir)
    if torch_only and record is not None:
        record = {**record, "accuracy": {"passed": [name for name in passed(record) if name not in ONNX_PRECISIONS]}}
    if override:
        precision = _check(override.strip().lower(), OVERRIDE_ENV)
        # An explicit bf16 on a CPU without bf16 instructions is served (a benchmark may want exactly that), with
        # the cost said; the settings refuse it for instance types without them (settings/serving.py).
        slow = (f"; this CPU has no bf16 instructions ({cpu.evidence}): oneDNN converts to fp32 and back, slower "
                "than fp32") if precision == "bf16" and not cpu.available else ""
        missing = unavailable(model_dir, precision)
        if missing:
            raise PrecisionRefused(f"{OVERRIDE_ENV}={precision} ({label(precision)}) cannot run: {missing}; "
                                   f"allowed here: {', '.join(_runnable(model_dir, record))}")
        if record is None or precision == "fp32":
            # fp32 is the reference; without a record there is no gate result to refuse on
            return precision, (f"{OVERRIDE_ENV}={precision} ({label(precision)})"
                               + ("" if record else " (the model has no gate record)") + slow)
        _refuse_unless_passed(model_dir, record, precision)
        return precision, (f"{OVERRIDE_ENV}={precision} ({label(precision)}), which passed this model's accuracy "
                           f"gate{slow}")
    if record is None:
        return "fp32", f"the model has no {RECORD} (packaged before the accuracy gate)"
    notes = []
    failed_export = (onnx_engine.read_manifest(Path(model_dir) / onnx_engine.ONNX_DIR) or {}).get("error")
    if failed_export:
        notes.append(f"no ONNX Runtime pair: the ONNX export failed at packaging ({failed_export})")
    if "bf16" in passed(record) and not cpu.available:
        notes.append("bf16 passed, but this CPU has no bf16 instructions")
    candidates = []
    for name in passed(record):
        missing = unavailable(model_dir, name)
        if missing:
            notes.append(f"{name} passed, but {missing}")
        elif name != "bf16" or cpu.available:
            candidates.append(name)
    dropped = f" ({'; '.join(notes)})" if notes else ""
    where = f"CPU: {cpu.evidence}"
    speeds = _speeds_for(record, cpu)
    timed = [name for name in candidates if speeds and name in speeds]
    if timed:
        chosen = min(timed, key=lambda name: (speeds[name], PRECISIONS.index(name)))
        figures = ", ".join(f"{name} {speeds[name]:.1f} ms" for name in timed)
        return chosen, (f"{label(chosen)}: fastest of the gate-passed pairs this CPU runs ({figures} per batch, "
                        f"timed on this kind of CPU){dropped}; {where}")
    order = DEFAULT_ORDER[cpu.available]
    chosen = next(name for name in order if name in candidates or name == "fp32")
    return chosen, (f"{label(chosen)}: gate passed {', '.join(passed(record))}{dropped}; no timing from this kind "
                    f"of CPU in {RECORD}, so the default order {' > '.join(order)}; {where}")


def _runnable(model_dir: Path, record: dict | None) -> list[str]:
    """The pairs an override may name for this model here: gate-passed (all, without a record) and runnable."""
    names = PRECISIONS if record is None else passed(record)
    return [name for name in names if not unavailable(model_dir, name)]


def _refuse_unless_passed(model_dir: Path, record: dict, precision: str) -> None:
    gate = record.get("gate", {})
    min_agreement = gate.get("min_agreement", MIN_AGREEMENT)
    tolerance = gate.get("max_probability_change", TOLERANCE)
    measured = {name: Figures.from_dict(name, data) for name, data in record.get("figures", {}).items()}
    entry = measured.get(precision)
    if entry is not None and entry.passed(min_agreement, tolerance):
        return
    allowed = [name for name in PRECISIONS if name == "fp32" or (name in measured and
                                                                  measured[name].passed(min_agreement, tolerance)
                                                                  and not unavailable(model_dir, name))]
    why = entry.describe(min_agreement, tolerance) if entry else f"{precision}: not measured by this model's gate"
    reference = measured.get("fp32")
    fp32_speed = f"; fp32 {reference.ms_per_batch:.1f} ms per batch" if reference and reference.ms_per_batch else ""
    raise PrecisionRefused(
        f"{OVERRIDE_ENV}={precision} failed this model's accuracy gate ({why}{fp32_speed}); allowed: "
        f"{', '.join(allowed)} (recorded choice: {record['precision']}, {Path(model_dir) / RECORD})"
    )


def activate(precision: str) -> None:
    """Set the process-wide math mode a precision runs with (the gate switches between them in one process)."""
    import torch

    _check(precision, "precision")
    # none: torch's default (ONNX Runtime pairs leave torch at fp32: it only pads and ranks around them)
    torch.backends.mkldnn.matmul.fp32_precision = "bf16" if precision == "bf16" else "none"


def process_environment(precision: str) -> dict[str, str]:
    """What a worker serving `precision` needs in its environment before it imports torch (oneDNN reads it then)."""
    _check(precision, "precision")
    return {FPMATH_ENV: "BF16"} if precision == "bf16" else {}


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
        return (onnx_engine.OnnxClassifier(path, threads=threads, replicas=replicas),
                AutoConfig.from_pretrained(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    model = apply(model, precision)
    return model, model.config
