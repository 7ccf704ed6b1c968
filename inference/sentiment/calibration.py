"""Which (engine, precision) pair answers, chosen on the CPU that serves: accuracy and speed measured here.

The packaging gate's figures describe the packaging CPU, and a timing taken there does not transfer (machines differ
several-fold even within x86; int8 kernels differ in accuracy, `inference.sentiment.int8_target`). This pass measures
both on this CPU, top to bottom, each step once:

1. Candidates: every pair the archive carries and this CPU runs (torch fp32 and int8 everywhere, torch bf16 where
   this CPU has bf16 instructions, the ONNX Runtime pairs where the archive has their graph and onnxruntime loads,
   ONNX Runtime's bf16 fast math on aarch64 with bf16 instructions).
   An override (`sentiment.precision`) makes it that pair alone: it skips the choice, not the accuracy check.
2. Accuracy: torch fp32 (the reference) and each candidate classify the held-out texts the archive ships
   (`calibration/texts.json`, written by `training.package`; for an archive packaged before it shipped them, the
   gate's own held-out sample, which the serving image carries) on this CPU's kernels; the gate's rule decides
   (`precision.Figures.passed`). A pair that fails, or cannot load, is dropped with its figures; an override that
   fails is refused (`precision.PrecisionRefused`) with them.
3. Speed: the passing pairs take turns on one batch of `BATCH_TEXTS` texts, after one untimed call each (a new
   shape pays for primitive creation and weight reorders), round after round; after the second round, a pair whose
   best is more than `DROP_FACTOR` times the leader's best is dropped. A lone pair is not timed. Rounds stop at
   `ROUNDS` or when the time budget is spent; past the budget the best pair measured so far wins.
4. Choice: the fastest passing pair by its best round (another process's work only ever adds time, so the best round
   is the steadiest figure). It stays loaded; the others are released.

Every pair means what it says: oneDNN's math mode is process-wide, so each call of a torch pair runs under its own
mode (`precision.activate`: bf16 fast math only for the bf16 pair), and after the choice the process holds and
serves one pair, whose mode stays set. `calibrate` returns the loaded pair and one line with the choice, every
pair's figures and the CPU.

    python -m inference.sentiment.calibration --model-dir artifacts/tiny-model.tar.gz   # what this CPU would serve
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from inference.sentiment import precision as precisions
from inference.sentiment.cpu_features import Bf16Support, this_cpu
from inference.sentiment.server.config import DEFAULT_CALIBRATION_SECONDS

PROG = "python -m inference.sentiment.calibration"
TEXTS = Path("calibration") / "texts.json"
BATCH_TEXTS = 8
ROUNDS = 5
DROP_FACTOR = 1.5
DEFAULT_BUDGET_S = float(DEFAULT_CALIBRATION_SECONDS)

Progress = Callable[[str], None]


@dataclass
class Calibration:
    """The chosen pair, loaded, and what was measured: `line` is the one start-up log line."""

    chosen: str
    sentiment: object  # the handler's SentimentModel for the chosen pair
    figures: list[precisions.Figures]
    seconds: float
    line: str
    dropped: dict[str, str] = field(default_factory=dict)  # pair -> why it was not timed to the end
    skipped: dict[str, str] = field(default_factory=dict)  # pair -> why it does not run here


def read_texts(model_dir: Path) -> list[str] | None:
    """The held-out texts the archive ships, None for an archive packaged before it shipped them."""
    path = Path(model_dir) / TEXTS
    if not path.is_file():
        return None
    texts = json.loads(path.read_text())
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) and text for text in texts):
        raise ValueError(f"{path}: not a list of texts")
    return texts


def write_texts(model_dir: Path, texts: list[str]) -> Path:
    """What `training.package` ships beside the model (the gate's held-out sample)."""
    path = Path(model_dir) / TEXTS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(texts, ensure_ascii=False) + "\n")
    return path


def candidates(model_dir: Path, override: str | None, cpu: Bf16Support) -> tuple[list[str], dict[str, str]]:
    """(pairs to measure, pair -> why not) for this archive on this CPU; fp32, the reference, always comes first."""
    skipped: dict[str, str] = {}
    names = [precisions.parse_override(override)] if override else list(precisions.PRECISIONS)
    wanted = []
    for name in names:
        missing = precisions.unavailable(model_dir, name) or precisions.cpu_reason(name, cpu)
        if name == "bf16" and not cpu.available and not override:
            skipped[name] = f"this CPU has no bf16 instructions ({cpu.evidence})"
        elif missing:
            if override:
                raise precisions.PrecisionRefused(f"{precisions.OVERRIDE_ENV}={name} ({precisions.label(name)}) "
                                                  f"cannot run: {missing}")
            skipped[name] = missing
        else:
            wanted.append(name)
    return ["fp32", *[name for name in wanted if name != "fp32"]], skipped


def calibrate(model_dir: Path, *, override: str | None = None, threads: int, replicas: int = 1,
              budget_s: float = DEFAULT_BUDGET_S, cpu: Bf16Support | None = None, texts: list[str] | None = None,
              progress: Progress | None = None) -> Calibration:
    """Measure the archive's pairs on this CPU and return the fastest that answers like fp32, loaded (module
    docstring). `texts`: the held-out sample (default: the archive's own)."""
    from inference.sentiment import accuracy_check
    from inference.sentiment import inference as handler

    say = progress or (lambda line: None)
    started = time.perf_counter()
    cpu = this_cpu() if cpu is None else cpu
    source = "given"
    if texts is None:
        texts, source = read_texts(model_dir), "the archive's"
    if texts is None:
        texts, source = accuracy_check.sample_texts(), f"the gate's sample ({TEXTS} not in the archive)"
    order, skipped = candidates(model_dir, override, cpu)
    dropped: dict[str, str] = {}
    loaded, figures, reference = {}, {}, None
    for name in order:  # 2. accuracy, fp32 first
        say(f"calibration: {name} ({precisions.label(name)}): loading and classifying {len(texts)} held-out texts")
        try:
            precisions.activate(name)
            sentiment = load(model_dir, name, threads=threads, replicas=replicas)
            if len(order) == 1:  # fp32 alone (its override) is the reference: nothing to compare, one warm-up call
                handler.predict_fn(handler.Request(texts[:BATCH_TEXTS]), sentiment)
                figures[name], loaded[name] = precisions.Figures(name, 1.0, 0.0), sentiment
                continue
            rows = accuracy_check.class_probabilities(sentiment, texts)
        except Exception as error:
            if name == "fp32":
                raise  # the reference: nothing to compare against without it
            figures[name] = precisions.Figures(name, error=_short(error))
            continue
        if name == "fp32":
            reference = rows
        agreement, worst = accuracy_check.compare(reference, rows)
        figures[name] = precisions.Figures(name, round(agreement, 6), round(worst, 6))
        if figures[name].passed():
            loaded[name] = sentiment
        else:
            del sentiment
    if override and override != "fp32" and not figures[order[-1]].passed():
        raise precisions.PrecisionRefused(
            f"{precisions.OVERRIDE_ENV}={order[-1]} does not answer like fp32 on this CPU: "
            f"{figures[order[-1]].describe()} ({cpu.evidence})")
    if override:  # the choice is the user's: only its accuracy was in question
        loaded = {order[-1]: loaded[order[-1]]}
    best = (_time(loaded, handler.Request(texts[:BATCH_TEXTS]), started, budget_s, dropped, say) if len(loaded) > 1
            else dict.fromkeys(loaded, 0.0))
    for name, milliseconds in best.items():
        if len(best) > 1:
            figures[name] = precisions.Figures(name, figures[name].agreement, figures[name].max_change,
                                               round(milliseconds, 2))
    chosen = min(best, key=lambda name: (best[name], precisions.PRECISIONS.index(name)))
    precisions.activate(chosen)  # the process serves this pair from now on
    seconds = time.perf_counter() - started
    measured = [figures[name] for name in order]
    line = _line(chosen, measured, dropped, skipped, override, seconds, budget_s, cpu,
                 f"{len(texts)} held-out texts, {source}")
    return Calibration(chosen, loaded[chosen], measured, seconds, line, dropped, skipped)


def load(model_dir: Path, name: str, *, threads: int, replicas: int, onnx_dir: Path | None = None):
    """The handler's SentimentModel for one pair, as the server runs it (`precision.load_engine`; `onnx_dir`: the
    gate's graphs exported beside a model directory)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from inference.sentiment import inference as handler

    hf_logging.disable_progress_bar()  # a loading bar per pair is noise in the start-up log
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model, config = precisions.load_engine(model_dir, name, threads=threads, replicas=replicas, onnx_dir=onnx_dir)
    return handler.SentimentModel(model=model, tokenizer=tokenizer, labels=handler.label_names(config.id2label),
                                  max_length=handler.max_input_length(tokenizer, config), threads=threads)


def _time(loaded: dict, batch, started: float, budget_s: float, dropped: dict[str, str],
          say: Progress) -> dict[str, float]:
    """Best ms per batch of each pair still in the race; warm-up call first, then rounds taking turns."""
    from inference.sentiment import inference as handler

    best: dict[str, float] = {}
    for round_number in range(ROUNDS + 1):  # round 0 warms each pair up on this shape and is not counted
        for name in list(loaded):
            if round_number > 1 and time.perf_counter() - started > budget_s:
                say(f"calibration: budget of {budget_s:g} s spent after round {round_number - 1}")
                return best
            precisions.activate(name)
            tick = time.perf_counter()
            handler.predict_fn(batch, loaded[name])
            if round_number:
                best[name] = min(best.get(name, float("inf")), (time.perf_counter() - tick) * 1000)
        if round_number >= 2:
            leader = min(loaded, key=best.__getitem__)
            for name in [name for name in loaded if name != leader and best[name] > DROP_FACTOR * best[leader]]:
                dropped[name] = (f"{best[name]:.1f} ms against {leader}'s {best[leader]:.1f}, dropped after round "
                                 f"{round_number}")
                del loaded[name]
        if round_number:
            say(f"calibration: round {round_number}/{ROUNDS}: " + ", ".join(
                f"{name} {best[name]:.1f} ms" for name in loaded))
    return best


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def _line(chosen: str, figures: list[precisions.Figures], dropped: dict[str, str], skipped: dict[str, str],
          override: str | None, seconds: float, budget_s: float, cpu: Bf16Support, texts: str) -> str:
    how = (f"{precisions.OVERRIDE_ENV}={chosen}, which answers like fp32 here" if override
           else "the fastest pair that answers like fp32 here")
    parts = []
    for entry in figures:
        if entry.error is not None:
            parts.append(f"{entry.precision} cannot run ({entry.error})")
            continue
        verdict = "PASS" if entry.passed() else "FAIL"
        speed = f", {entry.ms_per_batch:.1f} ms" if entry.ms_per_batch is not None else ""
        parts.append(f"{entry.precision} {verdict} (agree {entry.agreement:.1%}, max change {entry.max_change:.4f}"
                     f"{speed})")
    notes = ""
    if dropped:
        notes += "; not timed to the end: " + "; ".join(f"{name}: {why}" for name, why in dropped.items())
    if skipped:
        notes += "; not run here: " + "; ".join(f"{name}: {why}" for name, why in skipped.items())
    return (f"calibration: serving {chosen} ({precisions.label(chosen)}), {how}, in {seconds:.1f} s "
            f"(budget {budget_s:g} s; {texts}): " + "; ".join(parts) + notes
            + f"; ms per batch of {BATCH_TEXTS} texts, best round; CPU: {cpu.evidence}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-dir", required=True, type=Path, help="a model.tar.gz or its extracted folder")
    parser.add_argument("--precision", choices=precisions.PRECISIONS,
                        help="check this pair's accuracy here instead of choosing (sentiment.precision)")
    parser.add_argument("--threads", type=int, help="inference threads (default: torch's)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds the choice may take")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the choice, every pair's figures, the CPU and the versions here")
    return parser


def as_record(done: Calibration) -> dict:
    """What `--json` writes: the calibration and where it ran (`make check-arm` reads it from an emulated Arm CPU)."""
    import platform

    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if "onnxruntime" in sys.modules:  # loaded by an ONNX Runtime pair
        versions["onnxruntime"] = sys.modules["onnxruntime"].__version__
    return {"chosen": done.chosen, "seconds": round(done.seconds, 2), "machine": platform.machine(),
            "cpu": this_cpu().evidence, "versions": versions,
            "figures": [{key: value for key, value in asdict(entry).items() if value is not None}
                        for entry in done.figures],
            "dropped": done.dropped, "skipped": done.skipped, "line": done.line}


def main(argv: list[str] | None = None) -> int:
    import tarfile

    parser = build_parser()
    args = parser.parse_args(argv)
    # Before torch loads: OpenMP and oneDNN as the server runs them (its wait policy, its cache limits), or the
    # timings describe another process than the one that serves.
    from inference.sentiment.server.config import torch_runtime_defaults

    for name, value in torch_runtime_defaults().items():
        os.environ.setdefault(name, value)
    import torch

    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads {args.threads}: must be at least 1")
    if args.budget <= 0:
        parser.error(f"--budget {args.budget}: must be above 0")
    with tempfile.TemporaryDirectory(prefix="calibration-") as scratch:
        model_dir = args.model_dir
        if model_dir.is_file():
            with tarfile.open(model_dir, "r:gz") as archive:
                archive.extractall(scratch, filter="data")
            model_dir = Path(scratch)
        try:
            done = calibrate(model_dir, override=args.precision, threads=args.threads or torch.get_num_threads(),
                             budget_s=args.budget, progress=lambda line: print(line, file=sys.stderr, flush=True))
        except (FileNotFoundError, ValueError) as error:  # PrecisionRefused is a ValueError
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 2
    if args.json:
        args.json.write_text(json.dumps(as_record(done), indent=1) + "\n")
    print(done.line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
