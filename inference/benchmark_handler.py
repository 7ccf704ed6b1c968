"""Throughput and latency of our handler against the plain transformers pipeline, same model, same texts.

For each batch size every method classifies the same request batches, taking turns request by request so
machine noise hits them alike. Methods:
- `handler`: bytes in, bytes out, as the container runs it: input_fn -> predict_fn -> output_fn on a JSON body.
- `pipeline`: `pipeline("text-classification")(texts)`, the default call the issue compares with; it runs
  one forward pass per text.
- `pipeline-batched`: the same pipeline called with `batch_size=len(texts)`, for a fairer view of what
  batching alone buys (the pipeline then also pads dynamically).

Without --model-dir it builds a random-weight model on the repository's tokenizer: `--preset tiny` (2 layers
x 64, the test model) or `base` (RoBERTa-base's 12 x 768, the size that is deployed). Random weights cost the
same compute as trained ones. Timings are printed, never asserted.

    python -m inference.benchmark_handler                      # tiny model, about 20 s on 2 idle cores
    python -m inference.benchmark_handler --preset base --requests 10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inference.cli_types import non_negative_int, positive_int, positive_int_list

PROG = "python -m inference.benchmark_handler"
SAMPLE_DIR = Path(__file__).resolve().parent.parent / "training" / "data" / "sample"
# RoBERTa-base's shape, for `--preset base`.
BASE_SHAPE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}


@dataclass
class Result:
    method: str
    batch_size: int
    latencies: list[float]  # seconds per request
    elapsed: float  # seconds spent in this method's requests

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies) / self.elapsed

    def percentile(self, q: int) -> float:
        if len(self.latencies) == 1:
            return self.latencies[0]
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[q - 1]


def sample_texts() -> list[str]:
    """Every text of the shipped sample, in file order."""
    texts = []
    for path in sorted(SAMPLE_DIR.glob("*.jsonl")):
        texts += [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    return texts


def make_batches(texts: list[str], batch_size: int, count: int, seed: int) -> list[list[str]]:
    """`count` batches of tweet-like texts of one to four sample sentences, so lengths and padding vary."""
    rng = random.Random(seed * 1000 + batch_size)
    return [[" ".join(rng.sample(texts, rng.choice((1, 1, 2, 3, 4)))) for _ in range(batch_size)]
            for _ in range(count)]


def build_model_dir(directory: Path, preset: str) -> Path:
    """A random-weight classifier with the tiny tokenizer trained on the sample, saved like a trained model."""
    from training import tiny

    tokenizer = tiny.build_tokenizer(sample_texts())
    model = tiny.build_model(tokenizer)
    if preset == "base":
        from transformers import RobertaForSequenceClassification

        model.config.update(BASE_SHAPE)
        model = RobertaForSequenceClassification(model.config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def run(methods: dict[str, Callable[[list[str]], object]], batches: list[list[str]], warmup: int) -> list[Result]:
    """Time each method on every batch, taking turns per request; `warmup` untimed rounds first."""
    for batch in batches[:warmup]:
        for call in methods.values():
            call(batch)
    latencies: dict[str, list[float]] = {name: [] for name in methods}
    for batch in batches[warmup:]:
        for name, call in methods.items():
            started = time.perf_counter()
            call(batch)
            latencies[name].append(time.perf_counter() - started)
    return [Result(name, len(batches[0]), values, sum(values)) for name, values in latencies.items()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Requests/s and p50/p90 latency of the SageMaker handler vs the transformers pipeline.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model-dir", help="a saved model or model.tar.gz (default: build one with --preset)")
    parser.add_argument("--preset", choices=("tiny", "base"), default="tiny",
                        help="random-weight model to build when no --model-dir is given")
    parser.add_argument("--requests", type=positive_int, default=100, help="timed requests per batch size")
    parser.add_argument("--batch-sizes", type=positive_int_list, default=[1, 8, 32], help="texts per request")
    parser.add_argument("--warmup", type=non_negative_int, default=3, help="untimed requests first")
    parser.add_argument("--no-batched-pipeline", action="store_true", help="skip the pipeline(batch_size=n) row")
    parser.add_argument("--seed", type=int, default=0, help="seed for choosing the texts")
    return parser


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def benchmark(args, model_dir: Path) -> int:
    import torch
    import transformers
    from transformers import pipeline

    from inference.serve import Handler

    handler = Handler(model_dir)
    loaded = handler.model
    hooks = handler.module
    classifier = pipeline("text-classification", model=loaded.model, tokenizer=loaded.tokenizer, device="cpu")

    def ours(texts: list[str]):
        body = json.dumps({"inputs": texts}).encode()
        return hooks.output_fn(hooks.predict_fn(hooks.input_fn(body, "application/json"), loaded), "application/json")

    methods: dict[str, Callable[[list[str]], object]] = {"handler": ours, "pipeline": lambda texts: classifier(texts)}
    if not args.no_batched_pipeline:
        methods["pipeline-batched"] = lambda texts: classifier(texts, batch_size=len(texts))

    config = loaded.model.config
    print(f"model: {args.model_dir or args.preset + ' (random weights)'}: {config.num_hidden_layers} layers x "
          f"{config.hidden_size}, {sum(p.numel() for p in loaded.model.parameters()) / 1e6:.1f} M parameters; "
          f"max length {loaded.max_length}")
    print(f"torch {torch.__version__} with {torch.get_num_threads()} threads on {os.cpu_count()} CPUs, "
          f"transformers {transformers.__version__}; {args.requests} timed requests per row after "
          f"{args.warmup} warm-up, methods taking turns")
    texts = sample_texts()
    agreement = _agreement(ours, classifier, make_batches(texts, 32, 2, args.seed + 1))
    print(f"same labels as the pipeline on 64 texts: {agreement}")
    print()
    header = (f"{'batch':>5}  {'method':<17}{'req/s':>9}{'texts/s':>10}{'p50 ms':>9}{'p90 ms':>9}"
              f"  {'handler speed-up':>16}")
    print(header)
    print("-" * len(header))
    load_before = _load_average()
    started = time.perf_counter()
    for batch_size in args.batch_sizes:
        batches = make_batches(texts, batch_size, args.requests + args.warmup, args.seed)
        results = run(methods, batches, args.warmup)
        ours_rate = results[0].requests_per_second
        for result in results:
            rate = result.requests_per_second
            ratio = "" if result.method == "handler" else f"{ours_rate / rate:.2f}x"
            print(f"{batch_size:>5}  {result.method:<17}{rate:>9.1f}{rate * batch_size:>10.1f}"
                  f"{result.percentile(50) * 1000:>9.1f}{result.percentile(90) * 1000:>9.1f}  {ratio:>16}",
                  flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s of timing; load average before {load_before}, after "
          f"{_load_average()} (other work on the machine skews absolute figures, turn-taking keeps ratios fair).")
    print("Speed-up = handler req/s / that method's req/s (goal: >= 2x the plain pipeline on batches).")
    handler.close()
    return 0


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def _agreement(ours, classifier, batches: list[list[str]]) -> str:
    same = total = 0
    worst = 0.0
    for batch in batches:
        mine = json.loads(ours(batch)[0])
        theirs = classifier(batch)
        for a, b in zip(mine, theirs, strict=True):
            total += 1
            same += a["label"] == b["label"].lower()
            worst = max(worst, abs(a["score"] - b["score"]))
    return f"{same}/{total} (largest score difference {worst:.1e}; ties of a random model may flip)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_transformers()
    if args.model_dir:
        from inference.serve import ModelDirError

        try:
            return benchmark(args, Path(args.model_dir))
        except ModelDirError as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix=f"bench-{args.preset}-") as directory:
        return benchmark(args, build_model_dir(Path(directory), args.preset))


if __name__ == "__main__":
    sys.exit(main())
