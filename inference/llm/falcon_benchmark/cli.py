"""Command line of the Falcon batching benchmark (`make falcon-benchmark`, `-m inference.llm.falcon_benchmark`)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from common.cli_types import fraction, non_negative_int, positive, positive_int_list
from inference.llm.falcon_benchmark.aws import Account, CdkRunner
from inference.llm.falcon_benchmark.recipe import DEFAULT_CONCURRENCY, MODES, SHAPES, default_modes
from inference.llm.falcon_benchmark.run import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PRECONDITION,
    EXIT_USAGE,
    Benchmark,
    Plan,
)
from settings import REPO_ROOT, SettingsError, load_settings

PROG = "python -m inference.llm.falcon_benchmark"
DESCRIPTION = """\
The Falcon recipe's comparison as one command. For each batching mode, in order:
  1. deploy (or update) the environment's Falcon stack with -c falcon.enabled=true -c falcon.batching=MODE
     (`npx cdk deploy`; the network and artifacts stacks come along if they are missing);
  2. wait until the endpoint is InService, then warm it up with one generation;
  3. load-test each shape with `inference.llm.loadtest`: a concurrency sweep, --step-seconds per step,
     max_new_tokens always sent, token streaming (TTFT, inter-token latency) in the rolling modes;
     each report (report.json, .csv, .png) is kept under OUT/MODE/SHAPE/.
Then it destroys every stack it created (unless --keep) and prints one table beside the recipe's published
figures, writes OUT/compare.json, compare.csv and compare.png, and prints what the run cost.

Before anything is deployed it checks credentials, region, CDK bootstrap, the SageMaker endpoint quota and that
every mode synthesizes, and prints the hourly cost and an estimate for the run. Ctrl-C, SIGTERM or a failed
step still tears down; a second Ctrl-C during teardown stops it and prints the commands left to run.

The recipe: Falcon-40B fp16 on ml.g5.48xlarge (about $20/h), TP 8. A default run (2 modes x 2 shapes x
4 concurrencies x 120 s) takes about 1.5 h plus teardown: about $30; the recipe's three modes (LMI 0.23) about
2.3 h, $46. Try --modes rolling_paged --shapes 32x128 (about 35 min, $12) or --dry-run first.

  make falcon-benchmark ENV=dev MODES=dynamic,rolling_paged SHAPES=32x128,256x32
  make falcon-benchmark ARGS=--help           (GNU make answers `make X --help` itself)
  python -m inference.llm.falcon_benchmark --env dev --modes rolling,rolling_paged --dry-run
"""
EPILOG = ("Exit status: 0 every step passed; 1 a step failed, or some step's error rate exceeded --max-error-rate; "
          "2 usage or settings error; 3 a precondition failed (nothing deployed); 4 teardown incomplete (stacks "
          "may still be running: the commands to finish it are printed); 130 interrupted (torn down).")


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [mode for mode in modes if mode not in MODES]
    if not modes or unknown:
        raise argparse.ArgumentTypeError(f"modes {text!r}: expected a comma-separated list of {', '.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"modes {text!r}: each mode once")
    return modes


def _shapes(text: str) -> tuple[str, ...]:
    shapes = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    for shape in shapes:
        parts = shape.split("x")
        if len(parts) != 2 or not all(part.isdigit() and int(part) > 0 for part in parts):
            raise argparse.ArgumentTypeError(f"shape {shape!r}: expected IN x OUT tokens such as 32x128")
    if not shapes:
        raise argparse.ArgumentTypeError("expected at least one shape such as 32x128")
    return shapes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="dev", help="environment from cdk.json (default: dev)")
    parser.add_argument("--modes", type=_modes, metavar="MODE[,MODE...]",
                        help=f"batching modes to compare, in order, of {', '.join(MODES)} (default: every mode the "
                             "container offers: dynamic,rolling_paged; rolling too with falcon.lmi_version=0.23.0, "
                             "the only release with continuous batching without paging, past its end of patch: add "
                             "allow_unpatched_images=true)")
    parser.add_argument("--shapes", type=_shapes, default=SHAPES, metavar="INxOUT[,...]",
                        help=f"request shapes in tokens (default: the recipe's {','.join(SHAPES)})")
    parser.add_argument("--concurrency", type=positive_int_list, default=list(DEFAULT_CONCURRENCY),
                        metavar="N[,N...]", help="concurrent clients per step (default: "
                                                 f"{','.join(map(str, DEFAULT_CONCURRENCY))})")
    parser.add_argument("--step-seconds", type=positive(float), default=120.0, metavar="S",
                        help="measured seconds per load step (default: 120)")
    parser.add_argument("--warmup", type=non_negative_int, default=1, metavar="N",
                        help="unmeasured requests per client before each step (default: 1)")
    parser.add_argument("--max-error-rate", type=fraction, default=0.05, metavar="FRACTION",
                        help="a step above this error rate makes the exit status 1 (default: 0.05)")
    parser.add_argument("--no-stream", action="store_true",
                        help="plain requests in every mode (no TTFT or inter-token latency)")
    parser.add_argument("--tokenizer", metavar="DIR",
                        help="count tokens of whole answers with this tokenizer (default: whitespace words; "
                             "streamed answers are counted in tokens as sent)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="where reports go (default: runs/falcon-benchmark-ENV-<UTC time>)")
    parser.add_argument("--keep", action="store_true", help="leave what was deployed up at the end (costs money)")
    parser.add_argument("--reuse-existing", action="store_true",
                        help="update an existing Falcon stack in place (it is never destroyed)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check settings, synth, AWS preconditions and print the cost; deploy nothing")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting override for every deploy, as with cdk -c (e.g. falcon.lmi_version=0.35.0)")
    parser.add_argument("--poll-seconds", type=positive(float), default=30.0, help=argparse.SUPPRESS)
    return parser


@contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP end the run like Ctrl-C does, so CI cancellation and closed terminals tear down."""

    def interrupt(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None, *, account: Account | None = None, runner: CdkRunner | None = None,
         loadtest: Callable[[list[str]], int] | None = None, out: TextIO | None = None, **options: Any) -> int:
    """`account`, `runner`, `loadtest` and `options` (Benchmark fields) replace the real ones in tests."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    overrides = {}
    for item in args.context:
        key, equals, value = item.partition("=")
        if not equals or not key:
            print(f"{PROG}: error: -c {item!r}: expected KEY=VALUE", file=sys.stderr)
            return EXIT_USAGE
        overrides[key] = value
    try:
        if args.modes is None:
            args.modes = default_modes(load_settings(args.env, overrides).falcon.lmi_version)
        for mode in args.modes:  # every mode's settings, before anything costs money
            settings = load_settings(args.env, {**overrides, "falcon.enabled": "true", "falcon.batching": mode})
    except SettingsError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out_dir = args.out or REPO_ROOT / "runs" / f"falcon-benchmark-{args.env}-{stamp}"
    plan = Plan(settings=settings, modes=args.modes, shapes=args.shapes, concurrency=tuple(args.concurrency),
                step_seconds=args.step_seconds, out=out_dir,
                warmup_per_client=args.warmup, max_error_rate=args.max_error_rate, stream=not args.no_stream,
                tokenizer=args.tokenizer, keep=args.keep, reuse_existing=args.reuse_existing, dry_run=args.dry_run,
                overrides=overrides)
    runner = runner or CdkRunner()
    print(f"checking that {', '.join(args.modes)} synthesize (offline) ...", file=out or sys.stdout, flush=True)
    for mode in args.modes:  # a mode the container or GPUs cannot run fails synth here, not after a deploy
        if not runner.synth(plan.stack("falcon"), plan.context(mode)):
            print(f"{PROG}: error: falcon.batching={mode} does not synthesize (the reason is above)",
                  file=sys.stderr)
            return EXIT_PRECONDITION
    if account is None:
        import boto3

        account = Account(boto3.session.Session(region_name=None))
    if loadtest is None:
        from inference.llm import loadtest as loadtest_module

        loadtest = loadtest_module.main
    benchmark = Benchmark(plan=plan, account=account, runner=runner, loadtest=loadtest, out=out or sys.stdout,
                          poll_s=args.poll_seconds, **options)
    try:
        with _signals_interrupt():
            return benchmark.run()
    except KeyboardInterrupt:  # only if it came before run()'s own handling
        return EXIT_INTERRUPTED


__all__ = ["EXIT_OK", "build_parser", "main"]
