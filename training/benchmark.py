"""Time optimizer steps of the plain run against torch.compile + bf16 + fused AdamW.

Both runs train the same randomly initialised model on the same fixed batch, so the ratio isolates
the three speed-ups; throughput comes from the median step time, which a busy machine disturbs least.
On a GPU the model is RoBERTa-base sized (no download); on a CPU it is the tiny model, and the
speed-ups the CPU cannot run are left out and named. The recipe's figure to beat, measured with the
Trainer on a p4d.24xlarge, is 1.42x."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from common.cli_types import positive_int
from training import LABELS, hardware
from training.cuda_graphs import MODES

PROG = "python -m training.benchmark"
RECIPE_SPEEDUP = 1.42


@dataclass
class Result:
    name: str
    bf16: bool
    torch_compile: bool
    fused_adamw: bool
    tf32: bool
    warmup_seconds: float
    seconds: float
    samples_per_second: float
    final_loss: float
    # Median host milliseconds of each phase of a timed step (no device sync inside a phase: on a GPU, the time to
    # issue the work); "device wait" is the synchronize at the step end, i.e. what the device had left to do.
    host_ms: dict[str, float] | None = None


@dataclass
class Variant:
    """One run's switches."""

    name: str
    bf16: bool = False
    torch_compile: bool = False
    fused_adamw: bool = False
    tf32: bool = False


def model_config(size: str):
    """RoBERTa-base (with its own vocabulary), the tiny or the narrow-base model: training.tiny's sizes, so the bare
    loop runs the layers the Trainer path runs."""
    from transformers import RobertaConfig

    from training.tiny import RANDOM_BASE_MODEL_NAME, SIZES

    common = {"num_labels": len(LABELS), "type_vocab_size": 1, "pad_token_id": 1, "max_position_embeddings": 514}
    if size == "base":
        return RobertaConfig(vocab_size=50265, **SIZES[RANDOM_BASE_MODEL_NAME], **common)
    return RobertaConfig(vocab_size=2000, **SIZES[size], **common)


def run(variant: Variant, config, batch: dict, device: str, steps: int, warmup: int, seed: int,
        backend: str = "inductor", mode: str | None = None) -> Result:
    """Fresh model from `seed`, `warmup` untimed steps (compilation happens there), then `steps` timed. `mode`: the
    torch.compile mode, compiled as the Trainer path compiles (full graph, static shapes: training/cuda_graphs.py)."""
    import torch
    from transformers import RobertaForSequenceClassification

    torch.manual_seed(seed)
    model = RobertaForSequenceClassification(config).to(device).train()
    # Fused AdamW updates all parameters in one kernel; the baseline is torch's default implementation.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True if variant.fused_adamw else None)
    forward = (torch.compile(model, backend=backend, mode=mode, fullgraph=True, dynamic=False)
               if variant.torch_compile else model)
    # Through the precision API transformers uses, on a GPU only: TF32 means nothing on a CPU, and setting torch's
    # precision API leaves the legacy cuDNN getter raising (torch 2.13, torch/backends/cudnn/__init__.py set_flags),
    # which breaks a later torch.export in the same process (the ONNX export's, in the test suite's workers).
    if device == "cuda":
        hardware.set_tf32(variant.tf32)

    phases: dict[str, list[float]] = {name: [] for name in ("forward", "backward", "optimizer.step", "zero_grad",
                                                             "device wait")}
    clock = time.perf_counter

    def step(record: bool = False) -> torch.Tensor:
        marks = [clock()]
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=variant.bf16):
            loss = forward(**batch).loss
        marks.append(clock())
        loss.backward()
        marks.append(clock())
        optimizer.step()
        marks.append(clock())
        optimizer.zero_grad(set_to_none=True)
        marks.append(clock())
        if record:
            for name, begin, end in zip(phases, marks, marks[1:], strict=False):
                phases[name].append(end - begin)
        return loss

    def sync() -> None:
        getattr(torch, device).synchronize()  # torch.cpu.synchronize is a no-op, torch.cuda's waits for kernels

    start = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    warmed = time.perf_counter()
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        loss = step(record=True)
        waiting = time.perf_counter()
        sync()
        times.append(time.perf_counter() - begin)
        phases["device wait"].append(time.perf_counter() - waiting)
    seconds = time.perf_counter() - warmed
    return Result(
        name=variant.name,
        bf16=variant.bf16,
        torch_compile=variant.torch_compile,
        fused_adamw=variant.fused_adamw,
        tf32=variant.tf32,
        warmup_seconds=warmed - start,
        seconds=seconds,
        # The median step, not the mean: one stall on a shared machine should not move the figure.
        samples_per_second=batch["input_ids"].shape[0] / statistics.median(times),
        final_loss=float(loss.detach().float()),
        host_ms={name: round(statistics.median(values) * 1000, 4) for name, values in phases.items()},
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=positive_int, default=20, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=positive_int, default=3, help="untimed steps first (compilation)")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="the recipe's per-device batch")
    parser.add_argument("--seq-len", type=positive_int, default=128, help="tokens per example (padded)")
    parser.add_argument(
        "--model-size", choices=("auto", "base", "tiny", "narrow-base"), default="auto",
        help="auto: base on a GPU, tiny on a CPU; narrow-base: base's 12 layers at the tiny width (a base step's host "
        "work with little arithmetic)"
    )
    parser.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend (aot_eager: Dynamo and AOTAutograd without code generation)")
    parser.add_argument("--compile-mode", choices=MODES, default="auto",
                        help="torch.compile mode, as train_sentiment's --torch-compile-mode (auto: reduce-overhead, "
                        "CUDA graphs, on a GPU)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--fused-adamw", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--cpu-threads",
        type=positive_int,
        help="torch threads on a CPU (default: 1 for the tiny and narrow-base models, too small to split; torch's "
        "choice otherwise)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser


def precision(result: Result) -> str:
    """The optimized run's arithmetic: bf16 autocast, TF32 matmuls, or plain float32."""
    return "bf16 autocast" if result.bf16 else ("fp32 with TF32 matmuls" if result.tf32 else "fp32")


def describe(size: str, parameters: int, seq_len: int, device: str, machine: str, optimized: Result) -> str:
    """What the two runs compared, in one line: model size, sequence length, device and precision."""
    return (f"{size} model ({parameters / 1e6:.1f} M parameters), sequence length {seq_len}, {device} ({machine}), "
            f"optimized precision {precision(optimized)}")


def comparable(size: str, device: str) -> bool:
    """The recipe's 1.42x is RoBERTa-base on A100 GPUs; only a base-size run on a GPU measures the same thing."""
    return size == "base" and device == "cuda"


def recipe_note(size: str, device: str) -> str:
    if comparable(size, device):
        return f"the recipe measured {RECIPE_SPEEDUP:.2f}x with the Trainer, RoBERTa-base on a p4d.24xlarge (8x A100)"
    return (f"a {size} model on {device} measures this machine only; the recipe's figure is for RoBERTa-base on "
            "A100 GPUs (run with --model-size base on a GPU to compare)")


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.seq_len > 512:
        print(f"{PROG}: error: --seq-len {args.seq_len}: RoBERTa takes at most 512 tokens", file=sys.stderr)
        return 2
    import torch
    from transformers import RobertaForSequenceClassification

    from training import cuda_graphs

    # tf32=True: the Trainer turns TF32 on with torch.compile on Ampere+ GPUs, so the optimized run does too.
    speed = hardware.plan(args.bf16, args.torch_compile, args.fused_adamw, tf32=args.torch_compile)
    device = speed.device
    size = args.model_size if args.model_size != "auto" else ("base" if device == "cuda" else "tiny")
    config = model_config(size)
    if device == "cpu" and (args.cpu_threads or size in ("tiny", "narrow-base")):
        torch.set_num_threads(args.cpu_threads or 1)
    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.batch_size, args.seq_len)
    batch = {
        "input_ids": torch.randint(3, config.vocab_size, shape, generator=generator),
        "attention_mask": torch.ones(shape, dtype=torch.long),
        "labels": torch.randint(0, len(LABELS), (args.batch_size,), generator=generator),
    }
    batch = {key: value.to(device) for key, value in batch.items()}
    machine = hardware.report(device)["gpu"] or f"CPU, {torch.get_num_threads()} threads"
    parameters = RobertaForSequenceClassification(config).num_parameters()
    print(
        f"{device} ({machine}), {size} model ({parameters / 1e6:.1f} M parameters), batch {args.batch_size} x "
        f"{args.seq_len} tokens, {args.steps} timed steps after {args.warmup} warm-up"
    )
    mode = cuda_graphs.resolve_mode(args.compile_mode, device, speed.torch_compile)
    try:
        cuda_graphs.check(mode, backend=args.compile_backend, gradient_accumulation_steps=1, learning_rate=1e-5)
    except cuda_graphs.GraphConflict as error:
        print(f"{PROG}: error: {str(error).replace('--torch-compile-', '--compile-')}", file=sys.stderr)
        return 2
    print(f"{speed.summary()}; {cuda_graphs.describe(mode, device)}")
    optimized = Variant("optimized", speed.bf16, speed.torch_compile, speed.fused_adamw, bool(speed.tf32))
    common = {"config": config, "batch": batch, "device": device, "steps": args.steps, "warmup": args.warmup,
              "backend": args.compile_backend, "mode": mode}
    results = [run(Variant("baseline"), **common, seed=args.seed), run(optimized, **common, seed=args.seed)]

    print(f"{'run':<10} {'bf16':>5} {'compile':>8} {'fused':>6} {'tf32':>5} {'warm-up s':>10} {'samples/s':>10}")
    for result in results:
        print(
            f"{result.name:<10} {_on(result.bf16):>5} {_on(result.torch_compile):>8} {_on(result.fused_adamw):>6} "
            f"{_on(result.tf32):>5} {result.warmup_seconds:>10.1f} {result.samples_per_second:>10.1f}"
        )
    ratio = results[1].samples_per_second / results[0].samples_per_second
    left_out = ", ".join(f"{name} ({why})" for name, why in speed.turned_off.items()) or "nothing"
    print(f"compared: {describe(size, parameters, args.seq_len, device, machine, results[1])}; left out: {left_out}")
    print(f"speed-up optimized/baseline: {ratio:.2f}x; {recipe_note(size, device)}")
    if args.json:
        summary = {
            "device": device,
            "hardware": machine,
            "seq_len": args.seq_len,
            "precision": precision(results[1]),
            "comparable_with_recipe": comparable(size, device),
            "model_size": size,
            "parameters": parameters,
            "settings": {key: value for key, value in vars(args).items() if key != "json"},
            "results": [asdict(result) for result in results],
            "speedup": ratio,
            "compile_mode": mode,
            "left_out": speed.turned_off,
        }
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
