"""CUDA graphs for a host-bound training step: when they apply, what they rule out, and what they did.

On one H200 the optimized Trainer step took 31-39 ms for a few milliseconds of matrix work (docs/figures.md): the
step waits on Python and kernel launches, not on the GPU. torch.compile's `reduce-overhead` mode records the compiled
forward and backward as CUDA graphs, one per input shape (inductor's "cudagraph trees"), and replays each with one
launch, so the host's Python runs while the GPU works. The Trainer reaches it through its own arguments
(`TrainingArguments(torch_compile_mode=...)`, which transformers 5.20 hands to accelerate's `TorchDynamoPlugin`);
accelerate 1.16 reads `ACCELERATE_DYNAMO_USE_FULLGRAPH` and `ACCELERATE_DYNAMO_USE_DYNAMIC` for the rest
(`accelerate/utils/dataclasses.py`, `TorchDynamoPlugin.__post_init__`).

What must hold for a replay to be right, from PyTorch's `torch.compiler_cudagraph_trees` page ("Reasons for
Skipping", "Limitations"), and how this code keeps it:
- static shapes: `dynamic=False` here, automatic dynamic shapes off and one graph per length bucket
  (`training.speed.configure_dynamo`); more shapes than the recompile limit would fall back to eager silently, so
  the benchmark sets `TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1`, which makes a skip an error;
- the whole step in one graph (`fullgraph=True`) in one process: a graph break would leave eager code between the
  graphs (under DDP its wrapper breaks the graph by design: `dynamo_plugin_environment`);
- a step's outputs live until the next replay overwrites them: gradient accumulation above 1 keeps them across
  micro-batches (pytorch#169545), so it is refused; the Trainer adds each step's loss to its running total before
  the next step, which is in time;
- evaluation runs uncompiled: once `train()` has prepared the model, transformers 5.20's `evaluation_loop` evaluates
  `self.model`, the module under the compiled wrapper (`_wrap_model(self.model, training=False)`), so the logits it
  keeps by reference (`trainer_pt_utils.EvalLoopContainer`) are never a graph's output. Where an evaluation would
  run compiled (`evaluate()` before any training prepares the model), `RecipeTrainer` clones what it keeps
  (`clone_outputs`);
- a learning rate that is a tensor is read by the optimizer outside the graph at every step; only a plain number is
  accepted.
On a CPU the same mode compiles with inductor and skips CUDA graphs for CPU tensors ("skipping cudagraphs due to
cpu device"): the code path runs, the graphs do not.
"""

from __future__ import annotations

import contextlib
import numbers
import os
from unittest import mock

# torch.compile modes; "auto" is ours: reduce-overhead on a CUDA GPU, inductor's default elsewhere.
MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Inductor's modes that record CUDA graphs (`torch._inductor.list_mode_options()`: "triton.cudagraphs": True).
GRAPH_MODES = ("reduce-overhead", "max-autotune")
FULLGRAPH_VARIABLE = "ACCELERATE_DYNAMO_USE_FULLGRAPH"
DYNAMIC_VARIABLE = "ACCELERATE_DYNAMO_USE_DYNAMIC"


class GraphConflict(ValueError):
    """A combination that CUDA graphs would replay wrongly; one line that names the settings."""


def resolve_mode(requested: str, device: str, torch_compile: bool, world_size: int = 1) -> str | None:
    """The torch.compile mode a run uses: None for inductor's default (or no compile at all).

    "auto" records CUDA graphs for one process on a CUDA GPU only. Several processes (the p4d's 8) keep inductor's
    default until a multi-GPU run has measured them: DDP's wrapper and CUDA graphs together are a documented risk
    (pytorch#128218) that one GPU and CPUs cannot show. `--torch-compile-mode reduce-overhead` asks for them anyway.
    """
    if requested not in MODES:
        raise GraphConflict(f"--torch-compile-mode {requested!r} is not one of: {', '.join(MODES)}")
    if not torch_compile:
        return None
    if requested == "auto":
        return "reduce-overhead" if device == "cuda" and world_size == 1 else None
    return None if requested == "default" else requested


def records_graphs(mode: str | None) -> bool:
    """Whether this mode records CUDA graphs (on a GPU; on a CPU inductor skips them)."""
    return mode in GRAPH_MODES


def check(mode: str | None, *, backend: str, gradient_accumulation_steps: int, learning_rate) -> None:
    """Refuse what a replay would get wrong, on any device: the same command on a GPU would replay it."""
    if not records_graphs(mode):
        return
    named = f"--torch-compile-mode {mode}"
    if backend != "inductor":
        raise GraphConflict(f"{named} needs --torch-compile-backend inductor, got {backend!r}: only inductor "
                            "records CUDA graphs (use --torch-compile-mode default with other backends)")
    if gradient_accumulation_steps != 1:
        raise GraphConflict(
            f"--gradient-accumulation-steps {gradient_accumulation_steps} with {named}: each CUDA graph replay "
            "overwrites the previous micro-batch's outputs (pytorch#169545); allowed: 1, or --torch-compile-mode "
            "default to accumulate")
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, numbers.Real):
        raise GraphConflict(f"--learning-rate {learning_rate!r} with {named}: only a plain number is allowed (a "
                            "tensor learning rate is read outside the recorded graphs at every step)")


def dynamo_plugin_environment(compiled: bool, world_size: int):
    """Static shapes, and in one process a full graph, for accelerate's TorchDynamoPlugin, which the Trainer builds in
    `__init__` and which reads them from the environment; set only while the Trainer is made, so nothing else in the
    process sees them. With several processes accelerate compiles the DDP wrapper, whose own forward breaks the graph
    (torch 2.13 `nn/parallel/distributed.py`, `_pre_forward`: `self.logger.set_runtime_stats_and_log()`, seen as
    Dynamo's graph break gb0156 in tests/training/test_distributed.py), so full graph is asked for only in one."""
    if not compiled:
        return contextlib.nullcontext()
    values = {DYNAMIC_VARIABLE: "0", **({FULLGRAPH_VARIABLE: "1"} if world_size == 1 else {})}
    return mock.patch.dict(os.environ, values)


def clone_outputs(value):
    """A copy of evaluation outputs that no later replay can overwrite (tensors in nested tuples, lists, dicts)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple | list):
        return type(value)(clone_outputs(item) for item in value)
    if isinstance(value, dict):
        return {key: clone_outputs(item) for key, item in value.items()}
    return value


def describe(mode: str | None, device: str) -> str:
    """The log line's part: the compile mode, and whether its CUDA graphs apply here."""
    if mode is None:
        return "torch.compile mode default"
    if not records_graphs(mode):
        return f"torch.compile mode {mode}"
    return f"torch.compile mode {mode} ({'CUDA graphs' if device == 'cuda' else 'CUDA graphs: n/a on CPU'})"


def record(mode: str | None, device: str) -> dict:
    """What inductor's CUDA graphs did in this process, from torch's own records: `counters["inductor"]
    ["cudagraph_skips"]` counts every graph that fell back to eager, and each compile's metrics carry the reason
    (`CompilationMetrics.cudagraph_skip_reason`, torch 2.13 `_inductor/cudagraph_utils.py`
    `log_cudagraph_skip_and_bump_counter`). torch counts no replays; the benchmark counts them in its profile
    (`cudaGraphLaunch` calls)."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    if not records_graphs(mode):
        return {"applies": False, "why": f"compile mode {mode or 'default'} records no CUDA graphs"}
    reasons = sorted({entry.cudagraph_skip_reason for entry in get_compilation_metrics()
                      if getattr(entry, "cudagraph_skip_reason", None)})
    figures = {"skips": int(counters["inductor"]["cudagraph_skips"]), "skip_reasons": reasons}
    if device != "cuda":
        return {"applies": False, "why": "n/a on CPU", **figures}
    return {"applies": True, **figures}
