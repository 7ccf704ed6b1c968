"""The accuracy gate: which (engine, precision) pairs answer like torch fp32 on held-out text, and which of those is
fastest here.

For each pair (torch fp32, the reference; torch bf16; torch int8; ONNX Runtime fp32 and int8 on the graphs
`inference.sentiment.onnx_export` writes: `inference.sentiment.precision`) the model is loaded the way the server
loads it and classifies every held-out text of the shipped sample (training/data/sample/validation.jsonl and
test.jsonl, which `make train-local` never trains on). A precision passes when the best labels agree with fp32's
on at least `--min-agreement` of the texts and no class probability moves by more than `--tolerance`. The
precisions then take turns on one batch of `--batch-size` texts for `--rounds` rounds; the fastest that passed
(best round's ms per batch, on this machine: other work on a shared machine only ever adds time, so the best
round is the steadiest figure; the median is recorded too) is the gate's choice here (bf16 only where this CPU has
bf16 instructions). `training.package` (and SageMaker training, `training.sagemaker_entry`) runs this and writes
the result to `precision.json` in the archive: which precisions passed (true on any CPU whose int8 kernels do not
saturate the int8 graph's weights, `int8_target`) apart from the timings (true for this kind of CPU), for the
packaging report and the model registry; the server measures again on the CPU it runs on
(`inference.sentiment.calibration`).

    python -m inference.sentiment.accuracy_check --model-dir artifacts/tiny-model
    python -m inference.sentiment.accuracy_check --random-model roberta-base     # random weights, built here

The ONNX Runtime pairs run the model directory's `onnx/` graphs (a packaged archive's); a directory without them
(a training run's output) is exported into a temporary folder first (`--no-export`: measure torch only), and a
model that does not export fails those pairs "not measured", with the exporter's reason.

torch.compile for inference is not a pair: measured on the Zen 2 above (RoBERTa-base, 8 x 48 tokens, 2 threads,
docs/incoming-issue-35a.md) it did not pay for its compile time and recompiles under the server's varying shapes.

Exit status 0 when the gate ran (1 with --require PRECISION when that precision failed), 2 for a bad model
directory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from inference.sentiment import cpu_features, int8_target, onnx_engine
from inference.sentiment import precision as precisions
from inference.sentiment.server import config as server_config

PROG = "python -m inference.sentiment.accuracy_check"
SAMPLE_DIR = Path(__file__).resolve().parents[2] / "training" / "data" / "sample"
HELD_OUT = ("validation.jsonl", "test.jsonl")
DEFAULT_MIN_AGREEMENT = precisions.MIN_AGREEMENT
DEFAULT_TOLERANCE = precisions.TOLERANCE
DEFAULT_BATCH_SIZE = 8
DEFAULT_ROUNDS = 7
# RoBERTa-base's shape (roberta-base's config.json), for a random-weight model of the size we deploy.
RANDOM_MODELS = {"roberta-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                                  "intermediate_size": 3072}}

Progress = Callable[[str], None]


def sample_texts() -> list[str]:
    """The held-out texts: the sample's validation and test files (no network, never trained on)."""
    texts = []
    for name in HELD_OUT:
        path = SAMPLE_DIR / name
        texts += [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    return texts


def compare(reference: list[list[float]], candidate: list[list[float]]) -> tuple[float, float]:
    """(share of texts with the same best label, largest absolute probability difference)."""
    same = sum(max(range(len(a)), key=a.__getitem__) == max(range(len(b)), key=b.__getitem__)
               for a, b in zip(reference, candidate, strict=True))
    worst = max(abs(x - y) for a, b in zip(reference, candidate, strict=True) for x, y in zip(a, b, strict=True))
    return same / len(reference), worst


def load(model_dir: Path, precision: str, threads: int | None = None, onnx_dir: Path | None = None):
    """The handler's SentimentModel for a pair, loaded as the server loads it (`calibration.load`)."""
    import torch

    from inference.sentiment import calibration

    if threads:
        torch.set_num_threads(threads)
    return calibration.load(model_dir, precision, threads=torch.get_num_threads(), replicas=1, onnx_dir=onnx_dir)


def class_probabilities(sentiment, texts: list[str]) -> list[list[float]]:
    """One row per text, every label's probability in the model's label order, through the handler's predict_fn."""
    from inference.sentiment import inference as handler

    rows = []
    for start in range(0, len(texts), 32):
        ranked = handler.predict_fn(handler.Request(texts[start:start + 32], top_k=len(sentiment.labels)), sentiment)
        for entries in ranked:
            by_label = {entry["label"]: entry["score"] for entry in entries}
            rows.append([by_label[label] for label in sentiment.labels])
    return rows


def measure(model_dir: Path, wanted: tuple[str, ...] = precisions.PRECISIONS, *, texts: list[str] | None = None,
            batch_size: int = DEFAULT_BATCH_SIZE, rounds: int = DEFAULT_ROUNDS, threads: int | None = None,
            progress: Progress | None = None, onnx_dir: Path | None = None) -> list[precisions.Figures]:
    """Every wanted pair's figures against torch fp32; timed in turns (one round each, then the next round)."""
    from inference.sentiment import inference as handler

    say = progress or (lambda line: None)
    texts = sample_texts() if texts is None else texts
    order = ["fp32", *[name for name in precisions.PRECISIONS if name in wanted and name != "fp32"]]
    cpu = cpu_features.this_cpu()
    for name in [name for name in order if precisions.cpu_reason(name, cpu)]:
        say(f"gate: {name} ({precisions.label(name)}): not run here: {precisions.cpu_reason(name, cpu)}")
        order.remove(name)
    loaded, reference, errors, accuracy = {}, None, {}, {}
    for name in order:
        say(f"gate: {name} ({precisions.label(name)}): loading and classifying {len(texts)} held-out texts")
        try:
            loaded[name] = load(model_dir, name, threads, onnx_dir)
            rows = class_probabilities(loaded[name], texts)
        except Exception as error:
            if name == "fp32":
                raise  # the reference: nothing to compare against without it
            loaded.pop(name, None)
            errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".strip()
            say(f"gate: {name}: cannot load: {errors[name]}")
            continue
        if name == "fp32":
            reference = rows
        accuracy[name] = compare(reference, rows)
    batch = handler.Request(texts[:batch_size])
    samples: dict[str, list[float]] = {name: [] for name in loaded}
    for round_number in range(rounds + 1):  # round 0 warms each method up and is not counted
        for name, sentiment in loaded.items():
            precisions.activate(name)
            started = time.perf_counter()
            handler.predict_fn(batch, sentiment)
            if round_number:
                samples[name].append((time.perf_counter() - started) * 1000)
        if round_number:
            say(f"gate: timing round {round_number}/{rounds}: " + ", ".join(
                f"{name} {values[-1]:.1f} ms" for name, values in samples.items()))
    precisions.activate("fp32")
    figures = []
    for name in order:
        if name in errors:
            figures.append(precisions.Figures(name, error=errors[name]))
        else:
            agreement, worst = accuracy[name]
            figures.append(precisions.Figures(name, round(agreement, 6), round(worst, 6), round(min(samples[name]), 2),
                                              ms_median=round(statistics.median(samples[name]), 2)))
    return figures


def _machine() -> dict:
    """Where the timings were taken: the server trusts them only on the same kind of CPU (machine and bf16
    instructions), so the record says which machine they describe."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    bf16 = cpu_features.this_cpu()
    described = {"machine": platform.machine(), "cpu": cpu, "bf16_instructions": bf16.available,
                 # 7 where this CPU's int8 kernel saturates 8-bit weights (inference.sentiment.int8_target)
                 "int8_weight_bits": int8_target.resolve(int8_target.THIS_CPU).weight_bits,
                 "threads": torch.get_num_threads(), "torch": torch.__version__,
                 # As torch loaded it: a gate run inside training.package keeps the training process's policy.
                 "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    try:
        import torchao

        described["torchao"] = torchao.__version__
    except ImportError:
        pass
    if onnx_engine.runtime_installed():
        described["onnxruntime"] = onnx_engine.import_runtime().__version__
    return described


def gate_record(model_dir: Path, *, min_agreement: float = DEFAULT_MIN_AGREEMENT,
                tolerance: float = DEFAULT_TOLERANCE, batch_size: int = DEFAULT_BATCH_SIZE,
                rounds: int = DEFAULT_ROUNDS, threads: int | None = None,
                progress: Progress | None = None, onnx_dir: Path | None = None,
                wanted: tuple[str, ...] = precisions.PRECISIONS) -> dict:
    """precision.json for this model: the gate's choice, its thresholds, the figures and where they were measured
    (`onnx_dir`: where the exported graphs are, when not in the model directory's `onnx/`)."""
    texts = sample_texts()
    figures = measure(model_dir, wanted, texts=texts, batch_size=batch_size, rounds=rounds, threads=threads,
                      progress=progress, onnx_dir=onnx_dir)
    exported = onnx_engine.read_manifest(Path(onnx_dir) if onnx_dir else Path(model_dir) / onnx_engine.ONNX_DIR)
    details = {} if exported is None else {"onnx_export": exported}
    return precisions.make_record(
        figures, min_agreement=min_agreement, tolerance=tolerance,
        texts=len(texts), sample=[f"training/data/sample/{name}" for name in HELD_OUT],
        batch_texts=min(batch_size, len(texts)), rounds=rounds,
        measured_on=_machine(), measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), **details,
    )


def build_random_model(directory: Path, preset: str, seed: int = 42) -> Path:
    """A random-weight 3-class classifier of `preset`'s shape with the tiny tokenizer, saved like a trained model."""
    import torch
    from transformers import RobertaForSequenceClassification

    from training import tiny

    all_texts = []
    for path in sorted(SAMPLE_DIR.glob("*.jsonl")):
        all_texts += [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    tokenizer = tiny.build_tokenizer(all_texts)
    config = tiny.build_model(tokenizer).config
    config.update(RANDOM_MODELS[preset])
    torch.manual_seed(seed)
    RobertaForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def report(record: dict) -> list[str]:
    """The gate's figures as printed lines: one per precision, then the choice."""
    gate = record["gate"]
    lines = [f"accuracy gate on {gate['texts']} held-out texts ({', '.join(gate['sample'])}); "
             f"ms per batch of {gate['batch_texts']} texts, best of {gate['rounds']} rounds taking turns, on "
             f"{gate['measured_on']['cpu']} ({gate['measured_on']['threads']} threads, torch "
             f"{gate['measured_on']['torch']})"]
    width = max(len(precisions.label(name)) for name in record["figures"])
    for name, data in record["figures"].items():
        lines.append(f"  {precisions.label(name):<{width}}  " + precisions.Figures.from_dict(name, data).describe(
            gate["min_agreement"], gate["max_probability_change"]))
    exported = gate.get("onnx_export")
    if exported:
        versions = exported.get("versions", {})
        how = (f"{exported.get('exporter')}, opset {exported.get('opset')}, onnxruntime "
               f"{versions.get('onnxruntime')}")
        if exported.get("error"):
            lines.append(f"onnx export failed ({exported['error']}): the ONNX Runtime pairs were not measured; {how}")
        else:
            difference = exported.get("fp32_max_logit_difference")
            lines.append(f"onnx export: {', '.join(exported.get('graphs', {}))} in {exported.get('seconds')} s ({how}"
                         + ("" if difference is None else f"; fp32 graph's largest logit difference from torch "
                                                          f"{difference:.1e}") + ")"
                         + "".join(f"; {name} failed: {why}" for name, why in exported.get("errors", {}).items()))
            made = exported.get("int8") or {}
            if "weight_bits" in made:
                lines.append(f"int8 graph: {made['weight_bits']}-bit weights for {made['target']} ({made['why']})")
                if made["weight_bits"] > gate["measured_on"].get("int8_weight_bits", made["weight_bits"]):
                    lines.append("  (this CPU's int8 kernel saturates 8-bit weights: onnx-int8's figures here are "
                                 "worse than on the CPU the graph is made for)")
    lines.append(f"chosen: {record['precision']} ({precisions.label(record['precision'])}, the fastest that passed)")
    if record["gate"]["measured_on"].get("bf16_instructions") is False:
        lines.append("  (bf16 not chosen here: this CPU has no bf16 instructions)")
    if "accuracy" in record:
        lines.append(f"passed: {', '.join(record['accuracy']['passed'])} (on any CPU whose int8 kernel does not "
                     "saturate the int8 graph's weights); the server picks among them for "
                     "its own CPU")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir", type=Path, help="a saved model (the archive's root files)")
    source.add_argument("--random-model", choices=sorted(RANDOM_MODELS),
                        help="build a random-weight model of this size here (no download) and gate it")
    parser.add_argument("--min-agreement", type=float, default=DEFAULT_MIN_AGREEMENT,
                        help="least share of texts whose best label must not change")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help="largest allowed change of any class probability")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="texts in the timed batch")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="timed rounds per precision")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--no-export", action="store_true",
                        help="measure torch's pairs only when the model directory has no onnx/ graphs (default: "
                             "export them into a temporary folder first)")
    parser.add_argument("--serve-on", default=int8_target.THIS_CPU, metavar="INSTANCE_TYPE",
                        help="when exporting: the CPU the int8 graph's weights are made for (an instance type, e.g. "
                             f"{int8_target.DEFAULT_TARGET}, or {int8_target.THIS_CPU}, whose figures these are)")
    parser.add_argument("--require", choices=precisions.PRECISIONS,
                        help="exit 1 unless this precision passes the gate")
    parser.add_argument("--json", action="store_true", help="print the record (precision.json) instead of lines")
    return parser


def _positive(parser: argparse.ArgumentParser, args) -> None:
    for name in ("batch_size", "rounds", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} {value}: must be at least 1")
    if not 0 <= args.min_agreement <= 1:
        parser.error(f"--min-agreement {args.min_agreement}: must be between 0 and 1")
    if args.tolerance < 0:
        parser.error(f"--tolerance {args.tolerance}: must be at least 0")
    try:
        int8_target.resolve(args.serve_on)
    except ValueError as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> int:
    # Before torch loads (OpenMP reads its policy then): torch is timed as the server runs it. Under libgomp's default
    # spinning the tiny model's torch fp32 took 4.2-5.0 ms per batch on the Zen 2, under the server's PASSIVE policy
    # 5.4-5.7 ms; ONNX Runtime's own pool is unaffected, so the default would credit torch with speed it lacks there.
    # A caller's environment comes back afterwards (in a process where torch is loaded already it changes nothing).
    defaults = server_config.torch_runtime_defaults()
    saved = {name: os.environ.get(name) for name in defaults}
    os.environ.update(defaults)
    try:
        return _gate_command(argv)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _gate_command(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _positive(parser, args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.model_dir is not None and not (args.model_dir / "config.json").is_file():
        print(f"{PROG}: error: --model-dir {args.model_dir}: no config.json, not a saved model", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gate-model-") as scratch:
        model_dir = args.model_dir
        if model_dir is None:
            print(f"building a random-weight {args.random_model} classifier in {scratch}", file=sys.stderr, flush=True)
            model_dir = build_random_model(Path(scratch), args.random_model)
        progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        onnx_dir = None
        wanted = precisions.PRECISIONS
        if not (Path(model_dir) / onnx_engine.ONNX_DIR).is_dir():
            if args.no_export:
                wanted = tuple(name for name in wanted if name not in precisions.ONNX_PRECISIONS)
            else:
                from inference.sentiment import onnx_export

                onnx_dir = Path(scratch) / "exported-onnx"
                onnx_export.export(model_dir, onnx_dir, int8_target=int8_target.resolve(args.serve_on),
                                   progress=progress)
        record = gate_record(model_dir, min_agreement=args.min_agreement, tolerance=args.tolerance,
                             batch_size=args.batch_size, rounds=args.rounds, threads=args.threads,
                             progress=progress, onnx_dir=onnx_dir, wanted=wanted)
    print(json.dumps(record, indent=2) if args.json else "\n".join(report(record)))
    if args.require and not record["figures"].get(args.require, {}).get("passed"):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
