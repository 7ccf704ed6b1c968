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

The model is loaded with `problem_type` set (train_sentiment._load_model): RoBERTa's classifier otherwise sets
`config.problem_type` on its first forward, which breaks a Dynamo guard and compiles the model a second time.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

# Padded lengths are multiples of this many tokens (at most max_length): few shapes, little padding for tweets.
DEFAULT_BUCKET = 32
# Steps at the start that include compilation and warm-up; the benchmark leaves them out.
WARMUP_STEPS = 10


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


@dataclass
class BucketCollator:
    """Pads a batch of unpadded rows to its bucket length; counts what it padded (on the host, no device sync).

    `lengths=[max_length]` is the recipe's padding to max_length, with the same code path.
    """

    pad_token_id: int
    lengths: list[int]
    shapes: set[tuple[int, int]] = field(default_factory=set)
    useful_tokens: int = 0
    padded_tokens: int = 0
    rows: int = 0

    def __call__(self, features: list[dict]):
        import torch

        longest = max(len(feature["input_ids"]) for feature in features)
        width = bucket_for(longest, self.lengths)
        input_ids = torch.full((len(features), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(features), width), dtype=torch.long)
        for row, feature in enumerate(features):
            ids = feature["input_ids"][:width]
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        labels = torch.as_tensor([int(feature["labels"]) for feature in features], dtype=torch.long)
        self.shapes.add((len(features), width))
        self.useful_tokens += int(attention_mask.sum())
        self.padded_tokens += input_ids.numel()
        self.rows += len(features)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


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


def recipe_trainer(train_collator: BucketCollator):
    """A Trainer whose training batches are all full and padded by their own collator (evaluation keeps every row).

    The training collator is a separate instance so that its record of shapes is the training graph's shapes.
    Evaluation inside `train()` runs the model uncompiled (the Trainer evaluates `self.model`, not the compiled
    wrapper), so it adds no graphs; it pads to the same buckets, which keeps its padding small too.
    """
    from transformers import Trainer

    class RecipeTrainer(Trainer):
        def _get_train_sampler(self, train_dataset=None):
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            return TrainingBatches(len(dataset), self.args.per_device_train_batch_size, self.args.seed)

        def get_train_dataloader(self):
            evaluation_collator, self.data_collator = self.data_collator, train_collator
            try:
                return super().get_train_dataloader()
            finally:
                self.data_collator = evaluation_collator

    return RecipeTrainer


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


def make_step_timer(device: str):
    """A TrainerCallback that times each optimizer step from the previous step's end, device synchronized."""
    import torch
    from transformers import TrainerCallback

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []  # seconds from the previous step's end to this one's
            self.busy: set[int] = set()  # steps (1-based) whose interval held evaluation or a save
            self._last: float | None = None
            self.epoch_seconds: list[float] = []
            self._epoch_start: float | None = None

        def on_epoch_begin(self, args, state, control, **kwargs):
            synchronize()
            self._epoch_start = time.perf_counter()
            if self._last is not None:
                self._last = self._epoch_start  # the interval of an epoch's first step starts here

        def on_train_begin(self, args, state, control, **kwargs):
            synchronize()
            self._last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize()
            now = time.perf_counter()
            self.times.append(now - self._last)
            self._last = now

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


def write_timing(path: Path, timer, collator: BucketCollator, batch_size: int, extra: dict) -> dict:
    """The figures the benchmark reads back from a run (rank 0 writes them)."""
    figures = steady_state(timer.times, timer.busy)
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
        **extra,
    }
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result
