"""What the Trainer does on every step, made as cheap as the recipe's speed-ups deserve.

Measured on one H200 (FACTS.md, "Training on a real GPU"): with torch.compile + bf16 + fused AdamW the bare step loop
ran 1.75x faster than plain, but the Trainer's epochs after the first ran 0.96x. The pieces here remove, one by one,
what cost that speed on the Trainer's step path; each says why.

- `TrainingBatches` (a sampler): training drops the last partial batch, so every training step has the same batch
  size. A partial batch is another shape: torch.compile compiles it again (about 30 s on the GPU), and with
  automatic dynamic shapes on it then marks the batch dimension dynamic, and later full batches run the slower
  dynamic-shape graph. Only training drops rows, and different ones each epoch (the order is reshuffled every
  epoch); evaluation sees every row (a global `dataloader_drop_last` would drop evaluation rows too).
- `BucketCollator`: each batch is padded to the smallest of a few fixed lengths (multiples of `bucket`, up to
  `max_length`) that holds its longest row. Tweets are about 30 tokens: padding every row to 128 spends most of the
  GPU's work on padding. A bounded set of lengths keeps torch.compile to one static graph per length.
- `configure_dynamo`: automatic dynamic shapes off (each length keeps its own static graph, which is what the
  compiler is fastest at and what the bounded set of lengths makes affordable) and a recompile limit that fits them.
- `StepTimer` (a callback): the benchmark's clock. It synchronizes the device at each step end, so a step's time is
  the device's work, not the launch; it marks steps that evaluated or saved, to be left out.
- `compile_record`: how often and how long Dynamo compiled, from torch's own records (not from log text).
- `RecipeTrainer` (from `recipe_trainer`) trims host work the Trainer repeats at every step although nothing it
  depends on changed: it counts the parameters for `total_flos` once, calls `model.train()` only when evaluation
  left the model in eval mode, clears gradients from a list instead of a walk over every module, and clips gradients
  with torch's foreach arithmetic directly (accelerate's path adds a Python walk and a `.to()` per gradient). With
  the device synchronized at each step end (the benchmark's clock) or with a fast GPU waiting on the host, every
  millisecond of host work is a millisecond of step time.
- `HostClock`: host time spent in each piece of the Trainer's step path (no device sync), so the benchmark says where
  the Trainer's step time goes beside the bare loop's.
- `data_loader`: the training process collates its own batches (fast, in numpy: `BucketCollator`); receiving a batch
  from a worker process costs it more host time than that.

The model is loaded with `problem_type` set (train_sentiment._load_model): RoBERTa's classifier otherwise sets
`config.problem_type` on its first forward, which breaks a Dynamo guard and compiles the model a second time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# Padded lengths are multiples of this many tokens (at most max_length): few shapes, little padding for tweets.
DEFAULT_BUCKET = 32
# Steps at the start that include compilation and warm-up; the benchmark leaves them out.
WARMUP_STEPS = 10
# The training collator's record of one batch's padding, carried in the batch from the collator (which runs in a data
# loader worker process with --dataloader-workers N) to the training step, which removes it before the model sees it.
PADDING_KEY = "padding_counts"


def bucket_lengths(max_length: int, bucket: int) -> list[int]:
    """The padded lengths a batch can have: multiples of `bucket` below max_length, and max_length itself."""
    if bucket <= 0:
        raise ValueError(f"bucket must be positive, got {bucket}")
    lengths = list(range(bucket, max_length, bucket))
    return [*lengths, max_length]


def bucket_for(length: int, lengths: list[int]) -> int:
    """The smallest padded length that holds `length` tokens (rows are already truncated to the largest)."""
    for candidate in lengths:
        if length <= candidate:
            return candidate
    return lengths[-1]


class _PaddingCounts:
    """Counting shared by the collator and the tally (both have shapes, useful_tokens, padded_tokens, rows)."""

    def add(self, rows: int, width: int, useful: int) -> None:
        self.shapes.add((rows, width))
        self.useful_tokens += useful
        self.padded_tokens += rows * width
        self.rows += rows


@dataclass
class PaddingTally(_PaddingCounts):
    """What the training batches held: their shapes, and useful (non-padding) against padded tokens."""

    shapes: set[tuple[int, int]] = field(default_factory=set)
    useful_tokens: int = 0
    padded_tokens: int = 0
    rows: int = 0


@dataclass
class BucketCollator(_PaddingCounts):
    """Pads a batch of unpadded rows to its bucket length; counts what it padded (on the host, no device sync).

    `lengths=[max_length]` is the recipe's padding to max_length, with the same code path. With `carry_counts` the
    batch also carries its counts under PADDING_KEY (plain ints), for the RecipeTrainer to tally in the main process:
    in a data loader worker process the collator's own counts stay in that process.
    """

    pad_token_id: int
    lengths: list[int]
    shapes: set[tuple[int, int]] = field(default_factory=set)
    useful_tokens: int = 0
    padded_tokens: int = 0
    rows: int = 0
    carry_counts: bool = False

    def __call__(self, features: list[dict]):
        # Filled in numpy and handed to torch without a copy: the collator runs in the training process, on the step
        # path, and per-row torch slice assignments cost about 0.46 ms for 16 rows against 0.05 ms this way (2-vCPU
        # Zen 2; tests/training/test_bench_train.py checks both give the same tensors).
        import numpy as np
        import torch

        longest = max(len(feature["input_ids"]) for feature in features)
        width = bucket_for(longest, self.lengths)
        rows = [feature["input_ids"][:width] for feature in features]
        row_lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        for index, ids in enumerate(rows):
            input_ids[index, : len(ids)] = ids
        attention_mask = (np.arange(width) < row_lengths[:, None]).astype(np.int64)
        labels = np.fromiter((int(feature["labels"]) for feature in features), dtype=np.int64, count=len(features))
        useful = int(row_lengths.sum())
        self.add(len(features), width, useful)
        input_ids, attention_mask, labels = map(torch.from_numpy, (input_ids, attention_mask, labels))
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
        if self.carry_counts:
            batch[PADDING_KEY] = (len(features), width, useful)
        return batch


class TrainingBatches:
    """A fresh random order each epoch, cut to whole batches: every training step gets a full batch.

    With several processes the Trainer (accelerate) deals these rows out in batches of `batch_size` per process,
    so a multiple of `batch_size` keeps every process's batches full.
    """

    def __init__(self, rows: int, batch_size: int, seed: int) -> None:
        self.rows, self.batch_size, self.seed, self.epoch = rows, batch_size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        """The Trainer calls this at each epoch start: the order (and the rows left over) change with it."""
        self.epoch = epoch

    def __len__(self) -> int:
        if self.rows < self.batch_size:  # too few rows for one full batch: one smaller batch, still one shape
            return self.rows
        return self.rows - self.rows % self.batch_size

    def __iter__(self):
        import torch

        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.rows, generator=generator)[: len(self)]
        return iter(order.tolist())


def _no_train_call(module):
    """The module itself, as `train()` returns it: stands in for a `train()` call that would change nothing."""
    return lambda mode=True: module


@contextlib.contextmanager
def _train_call_skipped(model):
    """For the block, `model.train()` returns at once instead of walking every module (an instance attribute shadows
    nn.Module.train; whatever the instance held before, such as HostClock's wrapper, comes back afterwards)."""
    held = vars(model)
    previous = held.get("train")
    held["train"] = _no_train_call(model)
    try:
        yield
    finally:
        if previous is None:
            del held["train"]
        else:
            held["train"] = previous


def recipe_trainer(train_collator: BucketCollator):
    """A Trainer whose training batches are all full and padded by their own collator (evaluation keeps every row),
    with less host work per step.

    The training collator is a separate instance so that its record of shapes is the training graph's shapes; it
    carries each batch's counts to `training_step`, which tallies them in `trainer.padding` (the collator may run in a
    data loader worker process). Evaluation inside `train()` runs the model uncompiled (the Trainer evaluates
    `self.model`, not the compiled wrapper), so it adds no graphs; it pads to the same buckets, which keeps its padding
    small too.
    """
    from transformers import Trainer, TrainerCallback

    train_collator.carry_counts = True

    class ZeroGradByList(TrainerCallback):
        """For `train()`, the wrapped model's `zero_grad()` sets its parameters' gradients to None from a list made at
        the start, instead of walking every module at every step (transformers calls `model.zero_grad()` after each
        optimizer step: 0.56 ms a step for RoBERTa-base's 201 parameters on the 2-vCPU Zen 2, against 0.02 ms from
        a list). First among the callbacks, so that a later one (HostClock) wraps the list version."""

        def __init__(self, trainer) -> None:
            self.trainer = trainer

        def on_train_begin(self, args, state, control, **kwargs):
            wrapped = self.trainer.model_wrapped
            vars(wrapped)["zero_grad"] = zero_grad_by_list(wrapped)

        def on_train_end(self, args, state, control, **kwargs):
            vars(self.trainer.model_wrapped).pop("zero_grad", None)

    class RecipeTrainer(Trainer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.callback_handler.callbacks.insert(0, ZeroGradByList(self))
            self.padding = PaddingTally()
            self._flop_parameters: tuple[int, int] | None = None  # (id of the model counted, its count)
            # (id of the model checked, its trainable parameters, or None where the fast clipping does not apply)
            self._clip_parameters: tuple[int, list | None] | None = None
            # Set by the caller where the compile mode records CUDA graphs (training/cuda_graphs.py).
            self.graph_outputs_reused = False

        def _get_train_sampler(self, train_dataset=None):
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            return TrainingBatches(len(dataset), self.args.per_device_train_batch_size, self.args.seed)

        def get_train_dataloader(self):
            evaluation_collator, self.data_collator = self.data_collator, train_collator
            try:
                return super().get_train_dataloader()
            finally:
                self.data_collator = evaluation_collator

        def training_step(self, model, inputs, num_items_in_batch=None):
            counts = inputs.pop(PADDING_KEY, None)  # host ints for the tally; the model must not see them
            if counts is not None:
                self.padding.add(*counts)
            # transformers calls `model.train()` at every step: a walk over every module (about 1 ms per step for
            # RoBERTa-base on the 2-vCPU Zen 2, host time a fast GPU waits for). Only evaluation, which calls
            # `eval()` on `self.model`, takes the modules out of training mode here, and `eval()` clears the root
            # module's flag too: while both roots are in training mode the walk changes nothing and is skipped; the
            # first step after an evaluation still walks. (A module left in the wrong mode would show as a Dynamo
            # recompile on its `training` guard: tests/training/test_compile.py counts them.)
            if self.model.training and model.training:
                with _train_call_skipped(model):
                    return super().training_step(model, inputs, num_items_in_batch)
            return super().training_step(model, inputs, num_items_in_batch)

        def _clip_grad_norm(self, model):
            # transformers -> accelerate's `clip_grad_norm_` -> its DTensor-aware path walks the parameters in Python,
            # takes the norm of the norm, and torch's `get_total_norm` dispatches one `.to()` per gradient (about 200
            # calls a step for RoBERTa-base: host time a fast GPU waits for, seen with torch.profiler on the tiny
            # model). Where the gradients are plain tensors of one device and dtype, and no fp16 scaler needs them
            # unscaled first, the same clipping is torch's own arithmetic in about seven launches (two of them
            # foreach, one norm instead of two) and no Python loop over the gradients.
            gradients = self._plain_gradients(model)
            if gradients is None:
                return super()._clip_grad_norm(model)
            return clip_gradients(gradients, self.args.max_grad_norm)

        def _plain_gradients(self, model):
            """This step's gradients if the fast clipping applies to this run, else None (checked once a model)."""
            import torch
            from accelerate.utils import DistributedType

            if self._clip_parameters is None or self._clip_parameters[0] != id(model):
                parameters = [p for p in model.parameters() if p.requires_grad]
                plain = (self.accelerator.distributed_type in (DistributedType.NO, DistributedType.MULTI_GPU,
                                                               DistributedType.MULTI_CPU)
                         and getattr(self.accelerator, "scaler", None) is None
                         # transformers 5.20's check for DTensor gradients (an older release may lack it: the type
                         # check below refuses DTensor parameters anyway)
                         and not getattr(self, "_has_mixed_mesh_grads", lambda _: False)(model)
                         and len({(p.device, p.dtype) for p in parameters}) == 1
                         and all(type(p.data) is torch.Tensor for p in parameters))
                self._clip_parameters = (id(model), parameters if plain else None)
            parameters = self._clip_parameters[1]
            if parameters is None:
                return None
            return [p.grad for p in parameters if p.grad is not None]

        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            # A compiled model that records CUDA graphs returns outputs that its next replay overwrites, and the
            # Trainer keeps evaluation logits by reference (trainer_pt_utils.EvalLoopContainer). Evaluation after
            # `train()` runs the uncompiled module (training/cuda_graphs.py); one that runs the compiled model
            # (`evaluate()` before training prepared it) starts a new replay generation and keeps copies.
            if not (self.graph_outputs_reused and _is_compiled(model)):
                return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
            import torch

            from training import cuda_graphs

            torch.compiler.cudagraph_mark_step_begin()
            outputs = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
            return cuda_graphs.clone_outputs(outputs)

        def floating_point_ops(self, inputs) -> int:
            # transformers computes `6 x tokens x non-embedding parameters` for `total_flos` at every step, and
            # counts the parameters each time (`num_parameters(exclude_embeddings=True)` walks every module and
            # parameter: about 1 ms per step for RoBERTa-base on the Zen 2). The count cannot change while training,
            # so it is counted once per model; total_flos comes out the same.
            main_input = getattr(self.model, "main_input_name", "input_ids")
            if main_input not in inputs or not hasattr(self.model, "num_parameters"):
                return super().floating_point_ops(inputs)
            if self._flop_parameters is None or self._flop_parameters[0] != id(self.model):
                self._flop_parameters = (id(self.model), self.model.num_parameters(exclude_embeddings=True))
            return 6 * inputs[main_input].numel() * self._flop_parameters[1]

    return RecipeTrainer


def _is_compiled(model) -> bool:
    """torch.compile's wrapper, directly or under DDP's."""
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(model, OptimizedModule) or isinstance(getattr(model, "module", None), OptimizedModule)


def zero_grad_by_list(module):
    """`module.zero_grad` from a list of its parameters taken now (they do not change while it trains): the same
    effect as nn.Module.zero_grad (torch 2.13, nn/modules/module.py), which walks every submodule at each call."""
    parameters = list(module.parameters())
    walk = functools.partial(type(module).zero_grad, module)

    def zero_grad(set_to_none: bool = True) -> None:
        if not set_to_none:
            walk(set_to_none=False)
            return
        for parameter in parameters:
            parameter.grad = None

    return zero_grad


def clip_gradients(gradients: list, max_norm: float):
    """Scale `gradients` (plain tensors of one device and dtype) in place so their total 2-norm is at most
    `max_norm`; return the norm before clipping. The arithmetic of torch.nn.utils.clip_grad_norm_ (torch 2.13,
    nn/utils/clip_grad.py: `_get_total_norm`, `_clip_grads_with_norm_`) on its foreach path, without its per-group
    bookkeeping: no sync, nothing read back to the host."""
    import torch

    with torch.no_grad():
        if not gradients:
            return torch.tensor(0.0)
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(gradients, 2.0)), 2.0)
        torch._foreach_mul_(gradients, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


def data_loader(workers: int) -> dict:
    """TrainingArguments for the data loader: by default (0 workers) the training process collates its batches.

    Receiving a batch from a worker process costs the training process more host time than collating it: each tensor
    crosses as a shared-memory file descriptor, sent over a socket the receiver opens and authenticates per tensor,
    and on a GPU the pin-memory thread that receives it holds the GIL against the thread that launches the kernels.
    A stand-in for a host-bound GPU step on the 2-vCPU Zen 2 (1,500 small torch calls, about 8 ms, one worker on
    the other core) took 0.2 ms longer with this collator in the process, 0.7 ms longer with the collator it
    replaced, and 1.2-1.7 ms longer with batches received from the worker on a thread; through the Trainer the
    numbers are in docs/figures.md. `--dataloader-workers N` (train_sentiment, bench_train) measures the other way.
    """
    if workers == 0:
        return {"dataloader_num_workers": 0}
    return {"dataloader_num_workers": workers, "dataloader_persistent_workers": True, "dataloader_prefetch_factor": 2}


def configure_dynamo(shapes: int) -> None:
    """One static graph per batch shape, and room in Dynamo's cache for all of them.

    Automatic dynamic shapes would, at the second length it sees, compile a dynamic-length graph and try that entry
    first from then on; a dynamic graph is slower than a static one, and the set of lengths is small and known.
    """
    import torch._dynamo
    from torch._dynamo.utils import clear_compilation_metrics, counters

    # This run's record starts empty (tests train several times in one process).
    torch._dynamo.reset()
    counters.clear()
    clear_compilation_metrics()
    torch._dynamo.config.automatic_dynamic_shapes = False
    # A few spare entries: the default (8) is a guard against runaway recompiles, which we still want.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, shapes + 4)


def compile_record() -> dict:
    """How often and how long Dynamo compiled in this process, from torch's own records (not from log text).

    `get_compilation_metrics()` holds one entry per compiled frame and guard set: `recompile_reason` is set when a
    guard of an earlier entry failed (a recompile); `counters["stats"]["unique_graphs"]` counts the graphs made.
    """
    from torch._dynamo.utils import counters, get_compilation_metrics

    entries = get_compilation_metrics()
    seconds = sum(((entry.duration_us or 0) + (entry.backward_cumulative_compile_time_us or 0)) / 1e6
                  for entry in entries)
    reasons = [entry.recompile_reason for entry in entries if entry.recompile_reason]
    return {
        "compiles": len(entries),
        "recompiles": len(reasons),
        "recompile_reasons": reasons,
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "compile_seconds": round(seconds, 3),
    }


# Pieces of the Trainer's step path that HostClock times: (where, attribute, label). The Trainer's private methods are
# named as in transformers 5.20 (trainer.py `_run_epoch`); one that a version lacks is left out, not an error. The lr
# scheduler is not wrapped: its checkpoint (`state_dict`) is its whole `__dict__`, and a wrapper there cannot be saved.
HOST_PIECES = (
    ("trainer", "get_batch_samples", "next batch (data loader, collate, copy to device)"),
    ("trainer", "training_step", "training_step (all of it)"),
    ("wrapped", "train", "  model.train()"),
    ("trainer", "compute_loss", "  forward (compute_loss)"),
    ("accelerator", "backward", "  backward"),
    ("trainer", "floating_point_ops", "floating_point_ops (total_flos)"),
    ("trainer", "_track_num_input_tokens", "_track_num_input_tokens"),
    ("trainer", "_clip_grad_norm", "gradient clipping (max_grad_norm)"),
    ("trainer", "_get_grad_norm", "_get_grad_norm"),
    ("optimizer", "step", "optimizer.step"),
    ("wrapped", "zero_grad", "model.zero_grad"),
    ("trainer", "_maybe_log_save_evaluate", "_maybe_log_save_evaluate (no-op steps)"),
)


class HostClock:
    """Host seconds per call of each piece of the Trainer's step path, while the model trains.

    Each piece is wrapped, on the instance, by a perf_counter pair: no device sync, so on a GPU it is the host's time
    to issue the work, which is what a host-bound step is made of. Calls made while `trainer.model` is in eval mode
    (evaluation's forward passes) are not counted.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = defaultdict(list)

    def install(self, trainer) -> None:
        owners = {"trainer": trainer, "accelerator": trainer.accelerator, "optimizer": trainer.optimizer,
                  "wrapped": trainer.model_wrapped}
        for where, attribute, label in HOST_PIECES:
            owner = owners[where]
            original = getattr(owner, attribute, None)
            if owner is None or original is None:
                continue
            vars(owner)[attribute] = self._timed(original, label, trainer)

    def _timed(self, original, label: str, trainer):
        record = self.seconds[label]

        # wraps: keeps the markers others set on the original (the lr scheduler checks one on optimizer.step).
        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if trainer.model.training:
                    record.append(time.perf_counter() - start)

        return timed

    def summary(self, steps: int) -> dict[str, dict[str, float]]:
        """Per piece: the median call in milliseconds and the calls per step (median: warm-up and stalls drop out)."""
        return {label: {"median_ms": round(statistics.median(values) * 1000, 4),
                        "calls_per_step": round(len(values) / max(steps, 1), 3)}
                for label, values in self.seconds.items() if values}


# Steady steps that torch.profiler records for the kernel time per step (after the warm-up steps).
PROFILED_STEPS = 5


def profile_summary(profiler, steps: int, device: str) -> dict:
    """Per step, from torch.profiler's own totals: the time the device's kernels ran (on a CPU, the ops' self time:
    what a CPU can say) and the CUDA graph launches (each one a replay of a recorded graph)."""
    averages = profiler.key_averages()
    if device == "cuda":
        # The sum the profiler's table prints as "Self CUDA time total": every kernel once, inside graphs too.
        kernel_us = sum(average.self_device_time_total for average in averages)
        launches = sum(average.count for average in averages if average.key == "cudaGraphLaunch")
    else:
        kernel_us = sum(average.self_cpu_time_total for average in averages)
        launches = None
    return {"steps": steps, "kernel_ms_per_step": round(kernel_us / 1000 / steps, 4),
            "kernel_time": "device kernels" if device == "cuda" else "CPU ops' self time (profiler)",
            "graph_launches_per_step": None if launches is None else round(launches / steps, 2)}


def make_step_timer(device: str, profile_from: int | None = None):
    """A TrainerCallback that times each optimizer step from the previous step's end, device synchronized; with
    `attach(trainer)` it also times the pieces of the step path on the host (HostClock). With `profile_from`, steps
    `profile_from` to `profile_from + PROFILED_STEPS - 1` also run under torch.profiler (`profile`)."""
    import torch
    from transformers import TrainerCallback

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []  # seconds from the previous step's end to this one's
            # Of those, the seconds before the step began: fetching the next batch, the log/save/evaluate checks.
            # The device idles then (it was synchronized at the last step's end): pure host time.
            self.between: list[float] = []
            # Of those, the seconds the step-end synchronize waited: the device's work left when the host was done.
            self.waits: list[float] = []
            self.busy: set[int] = set()  # steps (1-based) whose interval held evaluation or a save
            self._last: float | None = None
            self.epoch_seconds: list[float] = []
            self._epoch_start: float | None = None
            self.host = HostClock()
            self._trainer = None
            self.profile: dict | None = None
            self.profiled: set[int] = set()  # steps run under the profiler, left out of the step times
            self._profiler = None
            self._busy_before: set[int] = set()  # the busy steps when the profile began

        def attach(self, trainer) -> None:
            self._trainer = trainer

        def on_epoch_begin(self, args, state, control, **kwargs):
            synchronize()
            self._epoch_start = time.perf_counter()
            if self._last is not None:
                self._last = self._epoch_start  # the interval of an epoch's first step starts here

        def on_train_begin(self, args, state, control, **kwargs):
            if self._trainer is not None:
                self.host.install(self._trainer)  # the optimizer, scheduler and wrapped model exist from here on
            synchronize()
            self._last = time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            if profile_from is not None and state.global_step + 1 == profile_from and state.is_world_process_zero:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if device == "cuda":
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                # A profiler that cannot start (CUPTI busy or missing) costs the figure, not the run.
                try:
                    self._profiler = torch.profiler.profile(activities=activities)
                    self._profiler.__enter__()
                except RuntimeError as error:
                    self._profiler, self.profile = None, {"error": f"{type(error).__name__}: {error}"[:300]}
                self._busy_before = set(self.busy)
            self.between.append(time.perf_counter() - self._last)

        def on_step_end(self, args, state, control, **kwargs):
            waiting = time.perf_counter()
            synchronize()
            now = time.perf_counter()
            self.waits.append(now - waiting)
            self.times.append(now - self._last)
            self._last = now
            if self._profiler is not None:
                self.profiled.add(state.global_step)  # the profiler's overhead is not a steady step's time
            if self._profiler is not None and state.global_step == profile_from + PROFILED_STEPS - 1:
                inside = {step for step in self.busy - self._busy_before if step < state.global_step}
                try:
                    self._profiler.__exit__(None, None, None)
                    self.profile = {**profile_summary(self._profiler, PROFILED_STEPS, device),
                                    "first_step": profile_from, "evaluation_or_save_inside": sorted(inside)}
                except RuntimeError as error:
                    self.profile = {"error": f"{type(error).__name__}: {error}"[:300]}
                self._profiler = None
                self._last = time.perf_counter()  # the profiler's own teardown is not the next step's time

        def on_epoch_end(self, args, state, control, **kwargs):
            synchronize()
            if self._epoch_start is not None:
                self.epoch_seconds.append(time.perf_counter() - self._epoch_start)

        def _mark_busy(self, state) -> None:
            # Evaluation and saving run after a step's end; they delay the next step, which is left out.
            self.busy.add(state.global_step + 1)
            self._last = time.perf_counter()

        def on_evaluate(self, args, state, control, **kwargs):
            synchronize()
            self._mark_busy(state)

        def on_save(self, args, state, control, **kwargs):
            synchronize()
            self._mark_busy(state)

    return StepTimer()


def steady_state(times: list[float], busy: set[int], skip: int = WARMUP_STEPS) -> dict[str, float | int]:
    """The median step time over the steps after the first `skip`, leaving out those with evaluation or saving."""
    kept = [seconds for step, seconds in enumerate(times, start=1) if step > skip and step not in busy]
    if not kept:
        return {"steps_measured": 0, "median_step_seconds": math.nan}
    return {"steps_measured": len(kept), "median_step_seconds": statistics.median(kept)}


def write_timing(path: Path, timer, collator: PaddingTally, batch_size: int, extra: dict) -> dict:
    """The figures the benchmark reads back from a run (rank 0 writes them)."""
    left_out = timer.busy | timer.profiled
    figures = steady_state(timer.times, left_out)
    between = steady_state(timer.between, left_out)["median_step_seconds"]
    wait = steady_state(timer.waits, left_out)["median_step_seconds"]
    median = figures["median_step_seconds"]
    tokens_per_row = collator.useful_tokens / collator.rows if collator.rows else math.nan
    padded_per_row = collator.padded_tokens / collator.rows if collator.rows else math.nan
    samples_per_second = batch_size / median if median and not math.isnan(median) else math.nan
    result = {
        **figures,
        "steps": len(timer.times),
        "busy_steps": sorted(timer.busy),
        "epoch_seconds": timer.epoch_seconds,
        "samples_per_second": samples_per_second,
        "useful_tokens_per_row": tokens_per_row,
        "padded_tokens_per_row": padded_per_row,
        "useful_tokens_per_second": samples_per_second * tokens_per_row,
        "padded_tokens_per_second": samples_per_second * padded_per_row,
        "training_shapes": sorted(collator.shapes),
        "median_between_steps_seconds": between,
        "median_device_wait_seconds": wait,
        "host_pieces": timer.host.summary(len(timer.times)),
        "profile": timer.profile,
        **extra,
    }
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result
