"""Requests/s of our handler against the Hugging Face inference toolkit's default, through the real serving stack.

Both run as model archives under the endpoint image's stack (TorchServe + SageMaker toolkit, see
`inference.sentiment.local_stack`), one after the other, with the container environment the stack sets, on the same
request batches sent over one keep-alive connection. Methods:
- `handler`: our archive (`training.package`): length-sorted buckets, dynamic padding.
- `handler-int8`: the same with `sentiment.quantize=int8` (dynamic int8 Linear layers; changes scores
  slightly, see `python -m inference.sentiment.accuracy_check`). Skip with --no-int8.
- `pipeline`: what a user gets from the Hugging Face inference toolkit's default handler, a transformers
  `pipeline("text-classification")` called per request (`serving/hf_default_handler.py`): one forward
  pass per text.

Without --model-dir it builds a random-weight model on the repository's tokenizer: `--preset base`
(RoBERTa-base's 12 x 768, the size that is deployed; the default) or `tiny` (2 x 64, the test model). Random
weights cost the same compute as trained ones. Timings are printed, never asserted. Needs `make serving-stack`.
SIGTERM or Ctrl-C (to the process or its group, once or repeated) stops the stack that is running and removes
the temporary files; exit status 0 after SIGTERM, 130 after SIGINT (`common.processes`).

    python -m inference.sentiment.benchmark_handler                        # base size, about 6 min on 2 cores
    python -m inference.sentiment.benchmark_handler --preset tiny --requests 20
    python -m inference.sentiment.benchmark_handler --preset tiny --threads 1,2 --requests 50   # thread counts
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import processes
from common.cli_types import non_negative_int, positive_int, positive_int_list

PROG = "python -m inference.sentiment.benchmark_handler"
SAMPLE_DIR = Path(__file__).resolve().parents[2] / "training" / "data" / "sample"
# RoBERTa-base's shape, for `--preset base`.
BASELINE_HANDLER = Path(__file__).resolve().parent / "serving" / "hf_default_handler.py"
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


def post_all(url: str, batches: list[list[str]]) -> list[float]:
    """Seconds per request for each batch, sent in order over one keep-alive connection; any non-200 raises."""
    import http.client
    from urllib.parse import urlsplit

    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=300)
    latencies = []
    try:
        for batch in batches:
            body = json.dumps({"inputs": batch}).encode()
            started = time.perf_counter()
            connection.request("POST", "/invocations", body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            latencies.append(time.perf_counter() - started)
            if response.status != 200 or len(json.loads(answer)) != len(batch):
                raise RuntimeError(f"{url}: status {response.status}: {answer[:300]!r}")
    finally:
        connection.close()
    return latencies


def run_method(archive: Path, quantize: str, plan: dict[int, list[list[str]]], warmup: int,
               log: Path, extra_env: dict[str, str] | None = None) -> dict[int, Result]:
    """Start the stack on one archive, time every batch size's requests after `warmup` untimed ones, stop."""
    from inference.sentiment.local_stack import LocalStack

    results = {}
    with LocalStack(archive, quantize=quantize, log=log, extra_env=extra_env) as stack:
        print(f"  serving {archive.name} at {stack.url} (quantize={quantize})", flush=True)
        for batch_size, batches in plan.items():
            post_all(stack.url, batches[:warmup])
            latencies = post_all(stack.url, batches[warmup:])
            results[batch_size] = Result("", batch_size, latencies, sum(latencies))
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Requests/s and p50/p90 latency of our handler vs the Hugging Face toolkit's default "
                    "(a transformers pipeline per request), both through TorchServe and the SageMaker toolkit.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model-dir", help="a saved model directory (default: build one with --preset)")
    parser.add_argument("--preset", choices=("tiny", "base"), default="base",
                        help="random-weight model to build when no --model-dir is given")
    parser.add_argument("--requests", type=positive_int, default=12, help="timed requests per batch size")
    parser.add_argument("--batch-sizes", type=positive_int_list, default=[1, 8, 32], help="texts per request")
    parser.add_argument("--warmup", type=non_negative_int, default=2, help="untimed requests first")
    parser.add_argument("--rounds", type=positive_int, default=2,
                        help="methods take turns this many times, each timing its share of the requests")
    parser.add_argument("--no-int8", action="store_true", help="skip the handler-int8 row")
    parser.add_argument("--threads", type=positive_int_list, default=None,
                        help="instead of the comparison: our handler with each OMP_NUM_THREADS, e.g. 1,2 "
                             "(how the thread formula in inference/sentiment/container.py was measured)")
    parser.add_argument("--seed", type=int, default=0, help="seed for choosing the texts")
    parser.add_argument("--log", type=Path, default=None,
                        help="append the stacks' output here (default: a temporary file, removed)")
    return parser


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def benchmark(args, model_dir: Path, workdir: Path) -> int:
    import transformers
    from transformers import AutoConfig

    from inference.sentiment.container import worker_threads
    from inference.sentiment.local_stack import SERVING_PYTHON
    from training import package

    ours = workdir / "handler.tar.gz"
    package.build(model_dir, ours)
    baseline = workdir / "pipeline.tar.gz"
    package.build(model_dir, baseline, handler=BASELINE_HANDLER)
    methods = [("handler", ours, "none", None), *([] if args.no_int8 else [("handler-int8", ours, "int8", None)]),
               ("pipeline", baseline, "none", None)]
    if args.threads:
        methods = [(f"threads={count}", ours, "none", {"OMP_NUM_THREADS": str(count)}) for count in args.threads]
    config = AutoConfig.from_pretrained(model_dir)
    cpus = len(os.sched_getaffinity(0))
    print(f"model: {args.model_dir or args.preset + ' (random weights)'}: {config.num_hidden_layers} layers x "
          f"{config.hidden_size}")
    print(f"stack: {SERVING_PYTHON.parent.parent.name} (TorchServe + SageMaker PyTorch toolkit), 1 worker, "
          f"OMP_NUM_THREADS={worker_threads(cpus, 1)} on {cpus} CPUs, transformers {transformers.__version__}; "
          f"{args.requests} timed requests per row, in {args.rounds} rounds of methods taking turns, "
          f"{args.warmup} warm-up per start")
    texts = sample_texts()
    plan = {size: make_batches(texts, size, args.requests + args.warmup, args.seed) for size in args.batch_sizes}
    log = args.log or workdir / "stacks.log"
    load_before = _load_average()
    started = time.perf_counter()
    results: dict[str, dict[int, Result]] = {}
    # Rounds take turns (A B C, A B C, ...), each timing its share of the requests, so load from other work
    # on the machine falls on every method alike; the rows pool every round's requests.
    for round_index in range(args.rounds):
        share = {size: [*batches[:args.warmup], *batches[args.warmup:][round_index::args.rounds]]
                 for size, batches in plan.items()}
        for name, archive, quantize, extra_env in methods:
            timed = run_method(archive, quantize, share, args.warmup, log, extra_env)
            for size, result in timed.items():
                pooled = results.setdefault(name, {}).setdefault(size, Result(name, size, [], 0.0))
                pooled.latencies += result.latencies
                pooled.elapsed += result.elapsed
            print(f"  round {round_index + 1}/{args.rounds} {name}: done", flush=True)
    print()
    header = (f"{'batch':>5}  {'method':<14}{'req/s':>9}{'texts/s':>10}{'p50 ms':>10}{'p90 ms':>10}"
              f"  {'vs ' + methods[-1][0]:>16}")
    print(header)
    print("-" * len(header))
    for batch_size in args.batch_sizes:
        reference = results[methods[-1][0]][batch_size].requests_per_second
        for name, *_ in methods:
            result = results[name][batch_size]
            rate = result.requests_per_second
            print(f"{batch_size:>5}  {name:<14}{rate:>9.2f}{rate * batch_size:>10.1f}"
                  f"{result.percentile(50) * 1000:>10.1f}{result.percentile(90) * 1000:>10.1f}"
                  f"  {rate / reference:>15.2f}x")
    print(f"\n{time.perf_counter() - started:.0f} s; load average before {load_before}, after {_load_average()} "
          "(other work on the machine skews the figures).")
    print(f"vs {methods[-1][0]} = that method's req/s / {methods[-1][0]}'s req/s"
          + ("" if args.threads else " (goal: >= 2x at batches 8 and 32)."))
    return 0


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except processes.Stopped as stopped:  # the stack and the temporary folder are gone by now
        print(f"{PROG}: stopped ({signal.Signals(stopped.signum).name})", flush=True)
        return stopped.exit_status


def _run(args) -> int:
    print(f"{PROG}: starting (pid {os.getpid()}); Ctrl-C or SIGTERM stops", flush=True)
    _quiet_transformers()
    from inference.sentiment.local_stack import StackError
    from training.package import PackageError

    with tempfile.TemporaryDirectory(prefix=f"bench-{args.preset}-") as directory:
        workdir = Path(directory)
        try:
            if args.model_dir:
                model_dir = Path(args.model_dir)
                if not model_dir.is_dir():
                    raise PackageError(f"--model-dir {model_dir}: no such directory")
            else:
                model_dir = build_model_dir(workdir / "model", args.preset)
            return benchmark(args, model_dir, workdir)
        except PackageError as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 2
        except (StackError, RuntimeError) as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    processes.install_stop_handlers()  # first: a signal while the model is built or a stack starts is handled too
    processes.finish(main())
