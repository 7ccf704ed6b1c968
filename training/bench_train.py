"""Plain against optimized through the real Trainer path (`training.train_sentiment`), launched by torchrun.

Every variant is the same program with the same data, seeds and launcher; only the speed-up flags differ:
  plain                 no torch.compile, float32, torch's default AdamW, every row padded to --max-length
  optimized             torch.compile + bf16 + fused AdamW (+ TF32 where the GPU has it), padded to --max-length:
                        run twice, the first time with an empty compile cache (cold), then with it filled (warm)
  optimized+buckets     the same, each batch padded to a multiple of --bucket-size (length-aware batches)
Each run's clock is a Trainer callback that synchronizes the device at every step end (training/speed.py). The
figures are the median step over the steps after the first 10, leaving out those with evaluation or a save, over
two epochs of at least 300 steps in all; useful tokens are the non-padding ones. Compile counts and seconds come
from Dynamo's own records. The bare step loop of `training.benchmark` runs last, for comparison (100 timed steps).
Where the Trainer's step time goes beside the bare loop's: the difference of the two median steps at the same batch
shape, the host time between steps (the device idles then), and the host time of each piece of the Trainer's step path
(training/speed.py, HostClock) next to the bare loop's forward, backward and optimizer step.

On a GPU the model has RoBERTa-base's dimensions (random weights, no download); on a CPU it is the tiny model, padded
to 64 tokens, compiled with the aot_eager backend (Dynamo and AOTAutograd without inductor's C++ builds, which cost
about a minute per new shape on a 2-core machine), and run once: a CPU run shows the command works, and what the
Trainer path does (graphs, recompiles, padding), not the GPU's speed-up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common.cli_types import non_negative_int, positive_int
from training.cuda_graphs import MODES
from training.data import SAMPLE_DIR
from training.speed import WARMUP_STEPS

PROG = "python -m training.bench_train"
# Dense bf16 tensor-core peaks, FLOP/s, by a fragment of torch.cuda.get_device_name(). NVIDIA datasheets: H100 SXM and
# H200 989.4 TFLOPS, H100 PCIe 756 TFLOPS, A100 312 TFLOPS; A10 125 TFLOPS (the A10G is AWS's A10 variant with lower
# clocks and no published datasheet, so MFU there is a lower bound).
BF16_PEAKS = (("H200", 989.4e12), ("H100 PCIe", 756e12), ("H100", 989.4e12), ("A100", 312e12), ("A10G", 125e12))
TRAIN_ROWS = 266  # rows of training/data/sample/train.jsonl
# The loss check: steps per run, and the largest difference of losses that bf16 rounding explains (bf16 keeps 8
# bits of mantissa, a relative step of 0.4%; two runs that fuse and order their arithmetic differently drift apart
# by about that much per step and partly cancel: 0.02 is 2% of an untrained 3-class loss, ln 3).
LOSS_CHECK_STEPS = 50
LOSS_TOLERANCE = 0.02
# A step is bound by the device when its time is at most this many times its kernels' time (issue 42).
DEVICE_BOUND_RATIO = 1.2
MIN_STEPS = 300
# train_sentiment's local model -> the bare loop's (training.benchmark --model-size) of the same shape.
BARE_LOOP_SIZES = {"tiny": "tiny", "random-base": "base", "narrow-base": "narrow-base"}


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]
    padding: str
    cache: str  # "cold": an empty compile cache; "warm": the one the cold run filled; "-": no compile


def variants(compile_backend: str, cold: bool, compile_mode: str = "auto") -> list[Variant]:
    # Each benchmark variant profiles 5 steady steps for its kernel time (the loss check's runs need none).
    profile = ("--profile-from", str(WARMUP_STEPS + 1))
    plain = ("--no-torch-compile", "--no-bf16", "--no-fused-adamw", "--no-tf32", *profile)
    fast = ("--torch-compile", "--torch-compile-backend", compile_backend, "--torch-compile-mode", compile_mode,
            "--bf16", "--fused-adamw", *profile)
    optimized = ([Variant("optimized (cold cache)", fast, "max-length", "cold"),
                  Variant("optimized (warm cache)", fast, "max-length", "warm")] if cold
                 else [Variant("optimized", fast, "max-length", "as found")])
    return [Variant("plain", plain, "max-length", "-"), *optimized,
            Variant("optimized+buckets", fast, "buckets", "warm" if cold else "as found")]


def loss_check_variants(compile_backend: str, compile_mode: str) -> list[Variant]:
    """The same 50 steps twice with dropout off: eager with the optimized run's precision, and the optimized run
    itself (compiled, CUDA graphs on a GPU). Only the compiler differs, so the losses must agree to bf16 rounding."""
    same = ("--bf16", "--fused-adamw", "--dropout", "0", "--max-steps", str(LOSS_CHECK_STEPS))
    return [Variant("loss-check-eager", ("--no-torch-compile", *same), "max-length", "-"),
            Variant("loss-check-compiled", ("--torch-compile", "--torch-compile-backend", compile_backend,
                                            "--torch-compile-mode", compile_mode, *same), "max-length", "as found")]


def loss_check(eager: dict, compiled: dict, tolerance: float = LOSS_TOLERANCE) -> tuple[bool, str]:
    """Whether the compiled run's losses (training mean, validation after the last step) match the eager run's."""
    pairs = {"training loss": (eager["train_loss"], compiled["train_loss"]),
             "validation loss": (eager["validation"]["loss"], compiled["validation"]["loss"])}
    worst = max(abs(b - a) for a, b in pairs.values())
    passed = worst <= tolerance
    shown = ", ".join(f"{name} eager {a:.4f} compiled {b:.4f}" for name, (a, b) in pairs.items())
    verdict = "pass" if passed else "FAIL"
    return passed, (f"loss check after {LOSS_CHECK_STEPS} steps, dropout off: {shown}; largest difference "
                    f"{worst:.4f} {'<=' if passed else '>'} {tolerance} (bf16 tolerance): {verdict}")


def peak_flops(gpu: str | None) -> float | None:
    """The GPU's dense bf16 peak from the table, or None when it is not there."""
    for fragment, peak in BF16_PEAKS:
        if gpu and fragment in gpu:
            return peak
    return None


def training_flops_per_token(config: dict, sequence: float) -> float:
    """Forward and backward FLOPs per token: 6 x non-embedding parameters plus attention's 12 x layers x width x
    sequence (the PaLM paper's appendix B accounting, applied to RoBERTa with its classification head)."""
    width, layers, inner = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    per_layer = 4 * (width * width + width) + 2 * width * inner + inner + width + 4 * width
    head = width * width + width + 3 * width + 3
    return 6 * (layers * per_layer + head) + 12 * layers * width * sequence


def mfu(timing: dict, peak: float | None) -> tuple[float | None, float | None]:
    """(model FLOP utilization on every token the device computed, on the useful tokens only)."""
    if not peak or not timing.get("samples_per_second") or math.isnan(timing["samples_per_second"]):
        return None, None
    sequence = timing["padded_tokens_per_row"]
    per_token = training_flops_per_token(timing["config"], sequence)
    executed = timing["padded_tokens_per_second"] * per_token / peak
    useful = timing["useful_tokens_per_second"] * per_token / peak
    return executed, useful


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", choices=("auto", *BARE_LOOP_SIZES), default="auto",
                        help="auto: random-base on a GPU, tiny on a CPU; narrow-base: RoBERTa-base's 12 layers at the "
                        "tiny width, so a CPU measures the host work of a base step")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="per device (the recipe's 16)")
    parser.add_argument("--max-length", type=positive_int,
                        help="padded length of the max-length runs (default: 128 on a GPU, 64 on a CPU)")
    parser.add_argument("--bucket-size", type=positive_int, default=32)
    parser.add_argument("--epochs", type=positive_int, default=2)
    parser.add_argument("--repeat", type=positive_int,
                        help="copies of the 266-row sample in the training set (default: enough for 300 steps)")
    parser.add_argument("--compile-backend",
                        help="torch.compile backend (default: inductor on a GPU, aot_eager on a CPU)")
    parser.add_argument("--compile-mode", choices=MODES, default="auto",
                        help="torch.compile mode of the optimized runs and the bare loop (auto: reduce-overhead, "
                        "CUDA graphs, on a GPU; training/cuda_graphs.py)")
    parser.add_argument("--loss-check", action=argparse.BooleanOptionalAction, default=False,
                        help=f"also train {LOSS_CHECK_STEPS} steps with dropout off eagerly and compiled, and compare "
                        f"the losses (exit 1 if they differ by more than {LOSS_TOLERANCE})")
    parser.add_argument("--cold-cache", action=argparse.BooleanOptionalAction, default=None,
                        help="run optimized twice, first with an empty compile cache, then warm (default: with "
                        "inductor; on a CPU the cold run costs minutes of C++ builds)")
    parser.add_argument("--only", help="comma-separated variant names to run (default: all)")
    parser.add_argument("--dataloader-workers", type=non_negative_int, default=0,
                        help="train_sentiment's data loader workers in every variant (0: the training process "
                        "collates, as train_sentiment does by default)")
    parser.add_argument("--bare-loop", action=argparse.BooleanOptionalAction, default=True,
                        help="also run training.benchmark's bare step loop at the same batch shape")
    parser.add_argument("--work-dir", type=Path, help="keep data, models and timings here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    return parser


def _device() -> tuple[str, str | None]:
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name(0)
    return "cpu", None


def _data(work: Path, repeat: int) -> Path:
    """The sample's training rows `repeat` times (the same rows and order for every variant)."""
    rows = (SAMPLE_DIR / "train.jsonl").read_text().strip().splitlines()
    path = work / "train.jsonl"
    path.write_text("\n".join(rows * repeat) + "\n")
    return path


def launch(variant: Variant, args, model: str, train_file: Path, work: Path, cache_root: Path | None) -> dict:
    """One torchrun launch of train_sentiment; returns its timing file, with the wall time of the launch."""
    name = variant.name.split(" ")[0] + ("-" + variant.cache.replace(" ", "-") if variant.cache != "-" else "")
    timing = work / f"{name}.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
        "-m", "training.train_sentiment",
        "--model-name-or-path", model,
        "--train-file", str(train_file),
        "--validation-file", str(SAMPLE_DIR / "validation.jsonl"),
        "--output-dir", str(work / name),
        "--max-length", str(args.max_length), "--padding", variant.padding, "--bucket-size", str(args.bucket_size),
        "--per-device-train-batch-size", str(args.batch_size), "--per-device-eval-batch-size", str(args.batch_size),
        "--num-train-epochs", str(args.epochs), "--learning-rate", "1e-3" if model == "tiny" else "1e-5",
        "--seed", "42", "--step-timing", str(timing), "--dataloader-workers", str(args.dataloader_workers),
        *variant.flags,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           # A graph that falls back to eager is an error, not a silently slower step (training/cuda_graphs.py).
           "TORCHINDUCTOR_CUDAGRAPH_OR_ERROR": "1"}
    if cache_root is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root / "inductor")
        env["TRITON_CACHE_DIR"] = str(cache_root / "triton")
    print(f"[{variant.name}] {' '.join(command[2:])}", flush=True)
    start = time.perf_counter()
    completed = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if completed.returncode != 0 or not timing.is_file():
        tail = "\n".join((completed.stdout + completed.stderr).strip().splitlines()[-25:])
        raise RuntimeError(f"{variant.name}: train_sentiment exited with {completed.returncode}\n{tail}")
    result = json.loads(timing.read_text())
    result["wall_seconds"] = round(wall, 1)
    result["train_loss"] = json.loads((work / name / "metrics.json").read_text())["train_loss"]
    return result


def bare_loop(args, model_size: str) -> dict | None:
    """training.benchmark at the same batch shape; its JSON summary."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "bare.json"
        command = [sys.executable, "-m", "training.benchmark", "--batch-size", str(args.batch_size),
                   "--seq-len", str(args.max_length), "--model-size", model_size, "--steps", "100",
                   "--compile-backend", args.compile_backend, "--compile-mode", args.compile_mode,
                   "--json", str(out)]
        print(f"[bare loop] {' '.join(command[1:])}", flush=True)
        completed = subprocess.run(command, capture_output=True, text=True)
        if completed.returncode != 0:
            print(f"bare loop failed ({completed.returncode}): {completed.stderr.strip()[-500:]}", file=sys.stderr)
            return None
        return json.loads(out.read_text())


def _fmt(value, spec: str, missing: str = "n/a") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def report(results: dict[str, dict], bare: dict | None, peak: float | None, peak_note: str) -> list[str]:
    lines = [f"{'variant':<24} {'padding':<10} {'samples/s':>9} {'useful tok/s':>12} {'step ms':>8} {'steps':>5} "
             f"{'graphs':>6} {'recomp.':>7} {'compile s':>9} {'MFU':>6} {'val acc':>7}"]
    for name, timing in results.items():
        compiled = timing.get("compile") or {}
        executed, _ = mfu(timing, peak)
        lines.append(
            f"{name:<24} {timing['padding']:<10} {_fmt(timing['samples_per_second'], '9.1f'):>9} "
            f"{_fmt(timing['useful_tokens_per_second'], '12.0f'):>12} "
            f"{_fmt(timing['median_step_seconds'] * 1000, '8.2f'):>8} {timing['steps_measured']:>5} "
            f"{compiled.get('unique_graphs', 0):>6} {compiled.get('recompiles', 0):>7} "
            f"{_fmt(compiled.get('compile_seconds'), '9.1f', '-'):>9} {_fmt(executed, '6.1%'):>6} "
            f"{_fmt((timing.get('validation') or {}).get('accuracy'), '7.3f'):>7}")
    lines.append(f"MFU: against {peak_note}; FLOPs per token 6 x non-embedding parameters + 12 x layers x width x "
                 "sequence (attention; PaLM's appendix B), on every computed token (padding included); graphs and "
                 "recompiles from Dynamo's records")
    lines += device_bound(results)
    plain = results.get("plain")
    warm = results.get("optimized (warm cache)") or results.get("optimized")
    buckets = results.get("optimized+buckets")
    trainer_ratio = None
    if plain and warm:
        trainer_ratio = warm["samples_per_second"] / plain["samples_per_second"]
        lines.append(f"Trainer path, optimized/plain at batch {plain['training_shapes'][0][0]} x "
                     f"{plain['lengths'][-1]}: {trainer_ratio:.2f}x")
    if bare:
        plain_bare, fast_bare = (result["samples_per_second"] for result in bare["results"])
        lines.append(f"bare loop (training.benchmark, {bare['model_size']} model, {bare['precision']}): plain "
                     f"{plain_bare:.1f}, optimized {fast_bare:.1f} samples/s, {bare['speedup']:.2f}x")
        if trainer_ratio:
            lines.append(f"Trainer ratio / bare-loop ratio: {trainer_ratio / bare['speedup']:.0%}")
    if warm and buckets:
        lines.append(f"length-aware batches vs padding to {warm['lengths'][-1]}: samples/s "
                     f"{buckets['samples_per_second'] / warm['samples_per_second']:.2f}x; useful tokens are "
                     f"{buckets['useful_tokens_per_row'] / buckets['padded_tokens_per_row']:.0%} of computed tokens "
                     f"(were {warm['useful_tokens_per_row'] / warm['padded_tokens_per_row']:.0%})")
    lines += host_overhead(plain, warm, bare)
    cold = results.get("optimized (cold cache)")
    if cold and cold.get("compile") and warm and warm.get("compile"):
        lines.append(f"compile seconds at {cold['lengths'][-1]} tokens: {cold['compile']['compile_seconds']:.1f} "
                     f"with an empty cache, {warm['compile']['compile_seconds']:.1f} with it warm")
    elif warm and warm.get("compile"):
        lines.append(f"compile seconds: {warm['compile']['compile_seconds']:.1f} (compile cache as found; --cold-cache "
                     "measures cold and warm)")
    return lines


def device_bound(results: dict[str, dict]) -> list[str]:
    """Per variant: the step against the time its kernels ran (torch.profiler over a few steady steps), and what
    the CUDA graphs did. A GPU step is bound by the device when it takes at most DEVICE_BOUND_RATIO x its kernels."""
    lines = []
    for name, timing in results.items():
        profile = timing.get("profile")
        compiled = timing.get("compile") or {}
        graphs = compiled.get("cuda_graphs") or {}
        on_gpu = timing.get("device") == "cuda"
        if not on_gpu:
            graph_note = "CUDA graphs: n/a on CPU"
        elif not graphs.get("applies"):
            graph_note = "CUDA graphs: off" + (f" ({graphs['why']})" if graphs.get("why") else " (not compiled)")
        else:
            reasons = f" ({'; '.join(graphs['skip_reasons'])})" if graphs.get("skip_reasons") else ""
            launches = (profile or {}).get("graph_launches_per_step")
            graph_note = (f"CUDA graphs: {_fmt(launches, '.1f')} replays per step, {graphs.get('skips', 0)} "
                          f"skipped{reasons}")
        shapes = len(timing.get("training_shapes") or [])
        per_shape = (f"; graphs per training shape {compiled['unique_graphs'] / shapes:.1f}"
                     if compiled.get("unique_graphs") is not None and shapes else "")
        if not profile or not profile.get("kernel_ms_per_step"):
            why = f" ({profile['error']})" if profile and profile.get("error") else ""
            lines.append(f"{name}: no profile{why}; {graph_note}{per_shape}")
            continue
        step_ms = timing["median_step_seconds"] * 1000
        ratio = step_ms / profile["kernel_ms_per_step"]
        if on_gpu:
            verdict = "device-bound" if ratio <= DEVICE_BOUND_RATIO else f"host-bound (over {DEVICE_BOUND_RATIO}x)"
        else:
            verdict = "a CPU's op time, not a device's kernels"
        lines.append(f"{name}: step {step_ms:.2f} ms, {profile['kernel_time']} {profile['kernel_ms_per_step']:.2f} ms "
                     f"per step over {profile['steps']} steps ({ratio:.2f}x: {verdict}); {graph_note}{per_shape}")
    return lines


def _bare_step_ms(bare: dict | None, index: int) -> float | None:
    if not bare:
        return None
    samples_per_second = bare["results"][index]["samples_per_second"]
    return bare["settings"]["batch_size"] * 1000 / samples_per_second if samples_per_second else None


def host_overhead(plain: dict | None, optimized: dict | None, bare: dict | None) -> list[str]:
    """Where the Trainer's step time goes beside the bare loop's: the difference of the median steps at the same batch
    shape (work the Trainer adds per step; with the device synchronized at each step end a host-bound step shows all
    of it), the host time between steps (the device idles then), and the host time of each piece of the step path."""
    runs = [(name, timing, _bare_step_ms(bare, index)) for index, (name, timing) in
            enumerate((("plain", plain), ("optimized", optimized))) if timing]
    if not runs:
        return []
    lines = []
    if bare:
        parts = [f"{name} {step_ms - bare_ms:+.2f} ms ({step_ms:.2f} against {bare_ms:.2f})"
                 for name, step_ms, bare_ms in ((name, timing["median_step_seconds"] * 1000, bare_ms)
                                                for name, timing, bare_ms in runs) if bare_ms]
        lines.append("Trainer step minus bare-loop step, same batch shape (per-step work the Trainer adds, and the "
                     "arithmetic on its padded rows: the bare loop's attention mask is all ones): " + ", ".join(parts))
    between = [f"{name} {timing['median_between_steps_seconds'] * 1000:.2f} ms" for name, timing, _ in runs
               if timing.get("median_between_steps_seconds") is not None]
    if between:
        lines.append("host time between steps (next batch, log/save checks; the device idles): " + ", ".join(between))
    pieces = list(dict.fromkeys(label for _, timing, _ in runs for label in timing.get("host_pieces") or {}))
    if not pieces:
        return lines
    bare_phases = {"  forward (compute_loss)": "forward", "  backward": "backward", "optimizer.step": "optimizer.step",
                   "model.zero_grad": "zero_grad"}
    header = "".join(f" {'Trainer ' + name:>18}" for name, _, _ in runs)
    bare_results = zip(("plain", "optimized"), bare["results"], strict=False) if bare else ()
    bare_columns = [(name, result["host_ms"]) for name, result in bare_results if result.get("host_ms")]
    header += "".join(f" {'bare ' + name:>15}" for name, _ in bare_columns)
    lines.append(f"host ms per step, median call x calls per step {'':<8}{header}")
    for label in pieces:
        cells = []
        for _, timing, _ in runs:
            piece = (timing.get("host_pieces") or {}).get(label)
            cells.append(f" {piece['median_ms'] * piece['calls_per_step']:>18.3f}" if piece else f" {'-':>18}")
        phase = bare_phases.get(label)
        cells += [f" {phases[phase]:>15.3f}" if phase in phases else f" {'':>15}" for _, phases in bare_columns]
        lines.append(f"  {label:<54}" + "".join(cells))
    # The wait at the step-end synchronize: near 0 when the host is the bottleneck, the device's backlog otherwise.
    cells = "".join(f" {timing['median_device_wait_seconds'] * 1000:>18.3f}"
                    if timing.get("median_device_wait_seconds") is not None else f" {'-':>18}" for _, timing, _ in runs)
    cells += "".join(f" {phases['device wait']:>15.3f}" for _, phases in bare_columns)
    lines.append(f"  {'device wait (synchronize at the step end)':<54}{cells}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device, gpu = _device()
    model = args.model if args.model != "auto" else ("random-base" if device == "cuda" else "tiny")
    args.max_length = args.max_length or (128 if device == "cuda" else 64)
    args.compile_backend = args.compile_backend or ("inductor" if device == "cuda" else "aot_eager")
    cold = args.cold_cache if args.cold_cache is not None else args.compile_backend == "inductor"
    steps_per_copy = TRAIN_ROWS / args.batch_size
    repeat = args.repeat or math.ceil(MIN_STEPS / args.epochs / steps_per_copy)
    chosen = variants(args.compile_backend, cold, args.compile_mode)
    if args.only:
        names = {name.strip() for name in args.only.split(",")}
        unknown = names - {variant.name.split(" ")[0] for variant in chosen}
        if unknown:
            print(f"{PROG}: error: --only {args.only}: unknown variant(s) {', '.join(sorted(unknown))}; "
                  "choose from plain, optimized, optimized+buckets", file=sys.stderr)
            return 2
        chosen = [variant for variant in chosen if variant.name.split(" ")[0] in names]
    steps = int(TRAIN_ROWS * repeat // args.batch_size) * args.epochs
    print(f"{device} ({gpu or 'CPU'}), model {model}, batch {args.batch_size}, max length {args.max_length}, "
          f"{TRAIN_ROWS * repeat} training rows x {args.epochs} epochs = {steps} steps per run, compile backend "
          f"{args.compile_backend}, data loader workers {args.dataloader_workers}, "
          + ("optimized run twice: an empty compile cache, then warm" if cold else "compile cache as found"),
          flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-train-") as temporary:
        work = args.work_dir or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        train_file = _data(work, repeat)
        cache_root = (work / "compile-cache") if cold else None
        results: dict[str, dict] = {}
        # A variant that fails (a CUDA graph skip is an error here) is reported and the others still run: a GPU's
        # lent minutes are too few to lose every figure to one variant.
        failed: dict[str, str] = {}
        for variant in chosen:
            try:
                timing = launch(variant, args, model, train_file, work, cache_root)
            except RuntimeError as error:
                print(f"{PROG}: {error}", file=sys.stderr, flush=True)
                failed[variant.name] = str(error)
                continue
            timing["cache"] = variant.cache
            results[variant.name] = timing
            print(f"[{variant.name}] {timing['samples_per_second']:.1f} samples/s over "
                  f"{timing['steps_measured']} steps, {timing['wall_seconds']} s", flush=True)
        checked = None
        if args.loss_check:
            try:
                checked = [launch(variant, args, model, train_file, work, cache_root)
                           for variant in loss_check_variants(args.compile_backend, args.compile_mode)]
            except RuntimeError as error:
                print(f"{PROG}: {error}", file=sys.stderr, flush=True)
                failed["loss check"] = str(error)
        bare = bare_loop(args, BARE_LOOP_SIZES[model]) if args.bare_loop else None

    peak = peak_flops(gpu) if device == "cuda" else None
    if peak:
        note = f"{gpu}'s dense bf16 peak {peak / 1e12:.0f} TFLOP/s"
    elif device == "cuda":
        note = f"no bf16 peak known for {gpu}: n/a"
    else:
        note = "nothing on a CPU (n/a: its roof on a shared machine moves with the load)"
    lines = report(results, bare, peak, note)
    passed = not failed
    if checked:
        checked_passed, line = loss_check(*checked)
        passed = passed and checked_passed
        lines.append(line)
    lines += [f"FAILED: {name} (its last lines are above)" for name in failed]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"device": device, "gpu": gpu, "model": model, "results": results,
                                         "bare_loop": bare, "peak_flops": peak, "peak": note, "report": lines,
                                         "loss_check": checked and {"passed": loss_check(*checked)[0],
                                                                    "runs": checked},
                                         "failed": failed},
                                        indent=2) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
