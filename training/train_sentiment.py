"""Fine-tune RoBERTa for three-class tweet sentiment with the HF Trainer.

One program for three places: `torchrun --nproc_per_node=gpu -m training.train_sentiment` on an
8-GPU instance (true DDP, one process per GPU), `python -m training.train_sentiment` on a laptop CPU
with `--model-name-or-path tiny`, and in-process from the tests through `main(argv)`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import random
import sys
import time
from importlib import metadata
from pathlib import Path

from common.cli_types import non_negative_int, positive_int
from training import ID2LABEL, LABEL2ID, LABELS, cuda_graphs
from training.data import DataError, DataSource, check_files, load_splits
from training.tiny import LOCAL_MODELS, NARROW_BASE_MODEL_NAME, TINY_MODEL_NAME

LOG = logging.getLogger("training.train_sentiment")
PROG = "python -m training.train_sentiment"
REQUIREMENTS = Path(__file__).parent / "requirements.txt"
BEST_METRIC = "recall_macro"
METRIC_NAMES = ("accuracy", "recall_macro", "f1_macro")
# Distributions whose versions go into metrics.json and are compared with requirements.txt.
VERSIONED = (
    "torch",
    "transformers",
    "tokenizers",
    "datasets",
    "accelerate",
    "safetensors",
    "huggingface-hub",
    "numpy",
)
# Files the Trainer leaves next to the final model that are training state, not model.
TRAINING_ONLY_FILES = ("training_args.bin",)


class UsageError(ValueError):
    """An argument combination that cannot run; printed as one `error:` line, exit status 2."""


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a probability from 0 up to (not including) 1, got {text}")
    return value


def _max_length(text: str) -> int:
    value = int(text)
    if not 8 <= value <= 512:
        raise argparse.ArgumentTypeError(f"must be between 8 and 512 tokens (RoBERTa's limit), got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Fine-tune a sequence classifier for tweet sentiment (0 negative, 1 neutral, 2 positive). "
            "Defaults reproduce the recipe; launch with torchrun for multi-GPU DDP."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model-name-or-path",
        default="cardiffnlp/twitter-roberta-base-sep2022",
        help=f"hub id or local directory; '{TINY_MODEL_NAME}' builds a 2-layer RoBERTa and trains its "
        "tokenizer on the training text (offline, for CPUs and tests); 'random-base' the same tokenizer with "
        "RoBERTa-base's dimensions and random weights (offline, for speed measurements on a GPU); 'narrow-base' "
        "its 12 layers at the tiny width (a base step's host work, for CPUs)",
    )
    model.add_argument("--cache-dir", help="where hub models and data sets are cached (default: HF_HOME)")

    data = parser.add_argument_group("data (hub data set, or local CSV/JSON/JSONL files)")
    data.add_argument("--dataset-name", default="cardiffnlp/tweet_eval")
    data.add_argument("--dataset-config", default="sentiment")
    data.add_argument("--train-file", help="local training file; needs --validation-file too")
    data.add_argument("--validation-file")
    data.add_argument("--test-file", help="optional with local files; test metrics are null without it")
    data.add_argument("--text-column", default="text")
    data.add_argument("--label-column", default="label")
    data.add_argument("--max-train-samples", type=positive_int,
                      help="train on a seeded random slice of this many rows (cheap smoke runs)")
    data.add_argument("--max-eval-samples", type=positive_int,
                      help="evaluate on at most this many validation and test rows each")
    data.add_argument(
        "--max-length",
        type=_max_length,
        default=128,
        help="truncate every input to this many tokens (and pad to it with --padding max-length); "
        "tweets fit in 128, the original recipe padded to 512",
    )
    data.add_argument(
        "--padding",
        choices=("buckets", "max-length"),
        default="buckets",
        help="buckets: pad each batch to the smallest multiple of --bucket-size (at most --max-length) that holds "
        "its longest row, so torch.compile sees a few fixed shapes and little padding; max-length: pad every row "
        "to --max-length (the recipe's static shape)",
    )
    data.add_argument("--bucket-size", type=positive_int, default=32, help="padded lengths are multiples of this")

    train = parser.add_argument_group("training")
    train.add_argument("--output-dir", default="model", help="final model, tokenizer and metrics.json")
    train.add_argument("--checkpoint-dir", help="per-epoch checkpoints (default: OUTPUT_DIR/checkpoints)")
    train.add_argument(
        "--resume-from-checkpoint",
        help="a checkpoint directory, or 'last' for the newest one in the checkpoint directory",
    )
    train.add_argument("--num-train-epochs", type=_positive_float, default=10.0)
    train.add_argument("--max-steps", type=positive_int, help="stop after this many optimizer steps")
    train.add_argument("--learning-rate", type=_positive_float, default=1e-5)
    train.add_argument("--per-device-train-batch-size", type=positive_int, default=16)
    train.add_argument("--per-device-eval-batch-size", type=positive_int, default=16)
    train.add_argument("--gradient-accumulation-steps", type=positive_int, default=1,
                       help="micro-batches per optimizer step (above 1 needs a compile mode without CUDA graphs)")
    train.add_argument("--warmup-steps", type=float, default=0, help="steps, or a fraction of all steps if < 1")
    train.add_argument("--weight-decay", type=float, default=0.0)
    train.add_argument("--save-total-limit", type=positive_int, default=2, help="checkpoints kept on disk")
    train.add_argument(
        "--save-strategy",
        choices=("best", "epoch"),
        default="best",
        help="best: write a checkpoint (model and optimizer state, about 1.5 GB for RoBERTa-base) only when "
        "validation macro recall improves, which is all the best model needs; epoch: after every epoch",
    )
    train.add_argument("--seed", type=int, default=42)
    train.add_argument("--dropout", type=_probability,
                       help="every dropout of the model (hidden, attention, classifier) set to this probability "
                       "(default: the model's own; 0 makes two runs comparable step by step, as make bench-train's "
                       "--loss-check does)")

    speed = parser.add_argument_group("PyTorch 2 speed-ups (each one is dropped where the hardware lacks it)")
    speed.add_argument(
        "--cpu-threads",
        type=positive_int,
        help="torch threads when training on the CPU (default: 1 for the tiny model, whose 64-wide matrices "
        "gain nothing from more and slow down badly on a busy machine; torch's choice otherwise)",
    )
    speed.add_argument(
        "--dataloader-workers",
        type=non_negative_int,
        default=0,
        help="data loader worker processes per training process; 0 collates in the training process, which costs "
        "it less host time per step than receiving each batch from a worker",
    )
    speed.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=True)
    speed.add_argument(
        "--torch-compile-backend",
        default="inductor",
        help="torch.compile backend: inductor generates fused kernels; eager and aot_eager run Dynamo's capture and "
        "guards without code generation (tests)",
    )
    speed.add_argument(
        "--torch-compile-mode",
        choices=cuda_graphs.MODES,
        default="auto",
        help="auto: reduce-overhead in one process on a CUDA GPU (the compiled forward and backward recorded as CUDA "
        "graphs and replayed with one launch each, for a step bound by the host), inductor's default elsewhere, "
        "several GPUs included until measured; training/cuda_graphs.py says what the graphs rule out",
    )
    speed.add_argument(
        "--step-timing",
        type=Path,
        metavar="FILE",
        help="write step times (device synchronized at each step end), padding and compile counts to FILE as JSON "
        "(make bench-train reads it)",
    )
    speed.add_argument(
        "--profile-from",
        type=non_negative_int,
        default=0,
        metavar="STEP",
        help="with --step-timing: run steps STEP to STEP+4 under torch.profiler and write the kernel time per step "
        "and the CUDA graph launches (0: no profile)",
    )
    speed.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    speed.add_argument(
        "--fused-adamw",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="optim adamw_torch_fused instead of adamw_torch",
    )
    speed.add_argument(
        "--tf32",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="TF32 matmuls on Ampere+ GPUs (default: transformers' choice, on with torch.compile)",
    )

    run = parser.add_argument_group("after training")
    run.add_argument(
        "--predict",
        action="append",
        default=[],
        metavar="TEXT",
        help="classify TEXT with the saved model and print the result (repeatable)",
    )
    return parser


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _setup_logging() -> None:
    level = logging.INFO if _rank() == 0 else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    import transformers

    # transformers' INFO level dumps whole configs; keep its warnings only.
    transformers.utils.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    import torch

    found["cuda"] = torch.version.cuda
    found["cudnn"] = str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None
    return found


def pinned_versions(path: Path = REQUIREMENTS) -> dict[str, str]:
    """`name==version` lines of training/requirements.txt, by lower-case name."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def version_drift(versions: dict[str, str | None]) -> dict[str, dict[str, str | None]]:
    """Installed versions that differ from the pins the code was tested with."""
    drift = {}
    for name, pinned in pinned_versions().items():
        installed = versions.get(name)
        if installed is None:
            try:
                installed = metadata.version(name)
            except metadata.PackageNotFoundError:
                installed = None
        if installed != pinned:
            drift[name] = {"pinned": pinned, "installed": installed}
    return drift


def compute_metrics(eval_prediction) -> dict[str, float]:
    """Accuracy, macro recall (the recipe's model-selection metric) and macro F1 over the three classes.

    Computed from the confusion counts with numpy, as scikit-learn defines them (`average="macro"`, every class
    counted, a class with no true or no predicted rows scores 0): scikit-learn was a dependency for these three
    numbers only, and transformers imports it at start wherever it is installed (2.6 s of CPU in every process).
    """
    import numpy as np

    logits, labels = eval_prediction.predictions, eval_prediction.label_ids
    if isinstance(logits, tuple):
        logits = logits[0]
    predicted = np.asarray(logits).argmax(axis=-1)
    labels = np.asarray(labels)
    classes = np.arange(len(LABELS))
    hits = np.array([np.sum((predicted == c) & (labels == c)) for c in classes], dtype=float)
    true = np.array([np.sum(labels == c) for c in classes], dtype=float)
    chosen = np.array([np.sum(predicted == c) for c in classes], dtype=float)
    recall = np.divide(hits, true, out=np.zeros_like(hits), where=true > 0)
    f1 = np.divide(2 * hits, true + chosen, out=np.zeros_like(hits), where=(true + chosen) > 0)
    return {
        "accuracy": float(np.mean(predicted == labels)) if labels.size else 0.0,
        "recall_macro": float(recall.mean()),
        "f1_macro": float(f1.mean()),
    }


@contextlib.contextmanager
def _quiet(logger_name: str, active: bool):
    """Raise a logger to ERROR for the duration of the block."""
    logger = logging.getLogger(logger_name)
    previous = logger.level
    if active:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _check_launch() -> None:
    """Several GPUs in one process would make the Trainer fall back to DataParallel; refuse that."""
    from training import hardware

    refusal = hardware.check_launch(hardware.visible_gpus(), dict(os.environ))
    if refusal:
        raise UsageError(refusal)


def _resume_path(args, checkpoint_dir: Path) -> str | None:
    if not args.resume_from_checkpoint:
        return None
    if args.resume_from_checkpoint == "last":
        from transformers.trainer_utils import get_last_checkpoint

        last = get_last_checkpoint(str(checkpoint_dir)) if checkpoint_dir.is_dir() else None
        if last is None:
            raise UsageError(f"--resume-from-checkpoint last: no checkpoint-* directory in {checkpoint_dir}")
        return last
    path = Path(args.resume_from_checkpoint)
    if not (path / "trainer_state.json").is_file():
        raise UsageError(
            f"--resume-from-checkpoint {path}: not a Trainer checkpoint (no trainer_state.json); "
            "give a checkpoint-* directory or 'last'"
        )
    return str(path)


def _load_model(args, train_texts: list[str]):
    """Tokenizer and classifier: the tiny one built here, or a pretrained one with a new 3-class head."""
    if args.model_name_or_path in LOCAL_MODELS:
        from training import tiny

        tokenizer = tiny.build_tokenizer(train_texts, model_max_length=args.max_length)
        model = tiny.build_model(tokenizer, max_length=args.max_length, seed=args.seed, name=args.model_name_or_path)
        return tokenizer, model
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path, cache_dir=args.cache_dir)
        model = AutoModelForSequenceClassification.from_pretrained(
            args.model_name_or_path,
            cache_dir=args.cache_dir,
            num_labels=len(LABELS),
            id2label=dict(ID2LABEL),
            label2id=dict(LABEL2ID),
            # Set now, not by the model's first forward: that forward would change the config under torch.compile,
            # break the guard on `config.problem_type` and compile the whole model a second time.
            problem_type="single_label_classification",
            # The base LM has no classifier, and a 3-class checkpoint's head is replaced on purpose.
            ignore_mismatched_sizes=True,
            # transformers 5 loads the checkpoint's own dtype by default ("auto"); mixed precision needs float32
            # master weights (bf16 autocast computes in bf16 and keeps the optimizer's state in float32).
            dtype=torch.float32,
        )
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"--model-name-or-path {args.model_name_or_path}: cannot be loaded ({first_line})") from error
    return tokenizer, model


def set_dropout(model, probability: float) -> None:
    """Every dropout module of the model at `probability`, and its config saying so. RoBERTa's attention reads its
    dropout module's `p` at each call (transformers 5.20 `modeling_roberta.py`), so setting the modules is enough."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = probability
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
        if hasattr(model.config, key):
            setattr(model.config, key, probability)


def _encode(tokenizer, split: dict[str, list], max_length: int):
    """Token ids truncated to max_length, unpadded (the collator pads each batch), as a datasets.Dataset."""
    from datasets import Dataset

    encoded = tokenizer(split["text"], truncation=True, max_length=max_length)
    return Dataset.from_dict({"input_ids": encoded["input_ids"], "labels": split["label"]})


def _truncated(tokenizer, texts: list[str], max_length: int) -> int:
    return sum(len(ids) > max_length for ids in tokenizer(texts, truncation=False)["input_ids"])


def _without_prefix(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {key[len(prefix) + 1 :]: value for key, value in metrics.items() if key.startswith(prefix + "_")}


def _training_arguments(args, speed, checkpoint_dir: Path, compile_mode: str | None):
    """The recipe's Trainer settings with transformers 5.x names, and the speed-ups this machine runs."""
    from transformers import TrainingArguments

    from training import hardware
    from training import speed as step_path

    return TrainingArguments(
        output_dir=str(checkpoint_dir),
        num_train_epochs=args.num_train_epochs,
        max_steps=args.max_steps or -1,
        learning_rate=args.learning_rate,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        eval_strategy="epoch",
        # Logging reads the loss from the device (a sync): once an epoch, never per step.
        logging_strategy="epoch",
        # "best" writes model and optimizer state only when the metric improves, which load_best_model_at_end needs;
        # the last such checkpoint is also what --resume-from-checkpoint last resumes from.
        save_strategy=args.save_strategy,
        save_total_limit=args.save_total_limit,
        load_best_model_at_end=True,
        metric_for_best_model=BEST_METRIC,
        greater_is_better=True,
        # Every parameter gets a gradient; searching for unused ones costs each DDP step a graph walk.
        ddp_find_unused_parameters=False,
        # The Trainer's per-step isnan/isinf check on the loss is a Python `if` on a device tensor: the host waits
        # for every step to finish before it can queue the next. A diverging run shows in the epoch's logged loss.
        logging_nan_inf_filter=False,
        # Pinned host memory lets the batch copy to the GPU run asynchronously (non_blocking) behind the previous
        # step instead of blocking the host (pinning is off on the CPU, where there is no copy).
        dataloader_pin_memory=speed.device == "cuda",
        accelerator_config={"non_blocking": speed.device == "cuda"},
        # The training process collates (a worker's batch costs it more to receive: training/speed.py).
        **step_path.data_loader(args.dataloader_workers),
        torch_compile_backend=args.torch_compile_backend if speed.torch_compile else None,
        torch_compile_mode=compile_mode,
        torch_compile=speed.torch_compile,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        bf16=speed.bf16,
        tf32=speed.tf32,
        optim=hardware.optimizer_name(speed),
        use_cpu=speed.device == "cpu",
        seed=args.seed,
        report_to="none",
        disable_tqdm=not sys.stderr.isatty(),
    )


def train(args) -> dict:
    """Run training and evaluation; return the metrics that rank 0 writes to metrics.json."""
    import torch
    import transformers

    from training import hardware
    from training import speed as step_path

    _check_launch()
    output_dir = Path(args.output_dir)
    checkpoint_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else output_dir / "checkpoints"
    resume = _resume_path(args, checkpoint_dir)
    source = DataSource(
        dataset_name=args.dataset_name,
        dataset_config=args.dataset_config,
        train_file=args.train_file,
        validation_file=args.validation_file,
        test_file=args.test_file,
        text_column=args.text_column,
        label_column=args.label_column,
        cache_dir=args.cache_dir,
    )

    speed = hardware.plan(args.bf16, args.torch_compile, args.fused_adamw, args.tf32)
    for name in hardware.lone_cpu_process(speed.device, dict(os.environ)):
        os.environ.pop(name)  # before TrainingArguments and accelerate read them
    if speed.device == "cpu":
        narrow = args.model_name_or_path in (TINY_MODEL_NAME, NARROW_BASE_MODEL_NAME)  # too small to split
        threads = args.cpu_threads or (1 if narrow else None)
        if threads:
            torch.set_num_threads(threads)

    # torchrun's (left out above for a lone CPU process): what the compile mode and the Trainer's plugin depend on.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    compile_mode = cuda_graphs.resolve_mode(args.torch_compile_mode, speed.device, speed.torch_compile, world_size)
    cuda_graphs.check(compile_mode, backend=args.torch_compile_backend,
                      gradient_accumulation_steps=args.gradient_accumulation_steps, learning_rate=args.learning_rate)
    # Our one-line summary below replaces transformers' own CPU warning about torch.compile.
    with _quiet("transformers.training_args", speed.device == "cpu"):
        training_args = _training_arguments(args, speed, checkpoint_dir, compile_mode)
    transformers.set_seed(args.seed)

    # Rank 0 downloads and validates first; the others then read the cache.
    with training_args.main_process_first(desc="load data"):
        splits = limit_splits(load_splits(source), args.max_train_samples, args.max_eval_samples, args.seed)
        tokenizer, model = _load_model(args, splits["train"]["text"])
    hardware.batch_mean_loss(model)  # else DDP multiplies loss and gradients by the number of processes
    if args.dropout is not None:
        set_dropout(model, args.dropout)
    # Logged once the inputs are known to be good, so a bad argument gives a single error line.
    LOG.info("%s; %s; %d CPU threads", speed.summary(), cuda_graphs.describe(compile_mode, speed.device),
             torch.get_num_threads())
    versions = _versions()
    drift = version_drift(versions)
    if drift:
        LOG.warning("installed versions differ from training/requirements.txt: %s", drift)
    encoded = {name: _encode(tokenizer, split, args.max_length) for name, split in splits.items()}
    truncated = _truncated(tokenizer, splits["train"]["text"], args.max_length)
    LOG.info(
        "examples: %s; %d training texts longer than %d tokens are truncated",
        {name: len(split["label"]) for name, split in splits.items()},
        truncated,
        args.max_length,
    )

    lengths = (step_path.bucket_lengths(args.max_length, args.bucket_size) if args.padding == "buckets"
               else [args.max_length])
    if speed.torch_compile:
        step_path.configure_dynamo(len(lengths))
    train_collator = step_path.BucketCollator(tokenizer.pad_token_id, lengths)
    if training_args.dataloader_num_workers:
        # The tokenizer ran in this process already; forked workers (which only collate) would each warn about it.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # The timer synchronizes the device at every step end: only a benchmark run (--step-timing) pays for that.
    timer = step_path.make_step_timer(speed.device, args.profile_from or None) if args.step_timing else None
    with cuda_graphs.dynamo_plugin_environment(speed.torch_compile, world_size):  # static shapes
        trainer = step_path.recipe_trainer(train_collator)(
            model=model,
            args=training_args,
            train_dataset=encoded["train"],
            eval_dataset=encoded["validation"],
            processing_class=tokenizer,
            data_collator=step_path.BucketCollator(tokenizer.pad_token_id, lengths),
            compute_metrics=compute_metrics,
            callbacks=[timer] if timer else None,
        )
    trainer.graph_outputs_reused = cuda_graphs.records_graphs(compile_mode)
    if timer:
        timer.attach(trainer)  # times the pieces of the step path on the host too
    padding = trainer.padding  # the training batches' shapes and padding, tallied in this process
    result = trainer.train(resume_from_checkpoint=resume)
    validation = _without_prefix(trainer.evaluate(encoded["validation"], metric_key_prefix="validation"), "validation")
    test = None
    if "test" in encoded:
        test = _without_prefix(trainer.evaluate(encoded["test"], metric_key_prefix="test"), "test")
    # After the final evaluations too: they run the uncompiled model and must add no graphs.
    compiled = ({**step_path.compile_record(), "mode": compile_mode or "default",
                 "cuda_graphs": cuda_graphs.record(compile_mode, speed.device)} if speed.torch_compile else None)

    trainer.save_model(str(output_dir))  # every rank calls it; only the main process writes
    if trainer.is_world_process_zero():
        for name in TRAINING_ONLY_FILES:
            (output_dir / name).unlink(missing_ok=True)

    state = trainer.state
    accelerator = hardware.report(speed.device)
    if args.step_timing and trainer.is_world_process_zero():
        step_path.write_timing(args.step_timing, timer, padding, args.per_device_train_batch_size, {
            "compile": compiled,
            "padding": args.padding,
            "lengths": lengths,
            "validation": validation,
            "device": speed.device,
            "gpu": accelerator["gpu"],
            "cpu_threads": torch.get_num_threads(),
            "world_size": training_args.world_size,
            "dataloader_workers": training_args.dataloader_num_workers,
            # What the step ran: the compiled wrapper, DDP (several processes), or the model itself.
            "wrapped_model": _wrappers(trainer.model_wrapped),
            "parameters": model.num_parameters(),
            "config": {key: getattr(model.config, key) for key in
                       ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")},
            "precision": {"bf16": speed.bf16, "torch_compile": speed.torch_compile, "fused_adamw": speed.fused_adamw},
        })
    return {
        "train_runtime": result.metrics.get("train_runtime"),
        "train_samples_per_second": result.metrics.get("train_samples_per_second"),
        "train_steps_per_second": result.metrics.get("train_steps_per_second"),
        "train_loss": result.metrics.get("train_loss"),
        "epochs": state.epoch,
        "global_steps": state.global_step,
        "best_checkpoint": state.best_model_checkpoint,
        f"best_validation_{BEST_METRIC}": state.best_metric,
        "validation": validation,
        "test": test,
        "examples": {name: len(split["label"]) for name, split in splits.items()},
        "truncated_train_texts": truncated,
        "padding": {"strategy": args.padding, "lengths": lengths, "training_shapes": sorted(padding.shapes),
                    "useful_token_share": round(padding.useful_tokens / max(padding.padded_tokens, 1),
                                                4)},
        "compile": compiled,
        "labels": {str(index): name for index, name in ID2LABEL.items()},
        "settings": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "effective": {
            "device": speed.device,
            "world_size": training_args.world_size,
            "dataloader_workers": training_args.dataloader_num_workers,
            "global_train_batch_size": args.per_device_train_batch_size * training_args.world_size,
            "bf16": speed.bf16,
            "torch_compile": speed.torch_compile,
            "torch_compile_mode": compile_mode,
            "fused_adamw": speed.fused_adamw,
            "tf32": accelerator["tf32"],
            "turned_off": speed.turned_off,
            "gpu": accelerator["gpu"],
            "cpu_threads": torch.get_num_threads(),
        },
        "versions": versions,
        "version_drift": drift,
        "is_main_process": trainer.is_world_process_zero(),
    }


def _wrappers(model) -> list[str]:
    """Class names from the outside in: torch.compile's wrapper (`_orig_mod`), DDP's (`module`), the model."""
    names = []
    while model is not None:
        names.append(type(model).__name__)
        model = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
    return names


def limit_splits(splits: dict[str, dict[str, list]], max_train: int | None, max_eval: int | None,
                 seed: int) -> dict[str, dict[str, list]]:
    """A seeded random slice of each split (the same rows on every rank), for cheap runs."""
    limited = {}
    for name, split in splits.items():
        limit = max_train if name == "train" else max_eval
        rows = len(split["label"])
        if limit is None or limit >= rows:
            limited[name] = split
            continue
        keep = sorted(random.Random(f"{seed}-{name}").sample(range(rows), limit))
        limited[name] = {column: [values[i] for i in keep] for column, values in split.items()}
    return limited


def _report(metrics: dict, output_dir: Path) -> None:
    for split in ("validation", "test"):
        values = metrics.get(split)
        if values:
            shown = "  ".join(f"{name} {values[name]:.3f}" for name in METRIC_NAMES)
            print(f"{split}: {shown}")
    print(
        f"train: {metrics['train_runtime']:.1f} s, {metrics['train_samples_per_second']:.1f} samples/s; "
        f"model and metrics.json in {output_dir}"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 for bad arguments or data)."""
    args = build_parser().parse_args(argv)
    try:
        check_files(
            DataSource(train_file=args.train_file, validation_file=args.validation_file, test_file=args.test_file)
        )
        _setup_logging()
        start = time.perf_counter()
        metrics = train(args)
    except (DataError, UsageError, cuda_graphs.GraphConflict) as error:
        _error(str(error))
        return 2
    from training import hardware

    try:
        if metrics.pop("is_main_process"):
            _finish(args, metrics, start)
    finally:
        hardware.leave_process_group()  # every rank, once rank 0 has written what it writes
    return 0


def _finish(args, metrics: dict, start: float) -> None:
    """Rank 0's part after training: metrics.json, the summary, and any predictions asked for."""
    metrics["wall_seconds"] = round(time.perf_counter() - start, 2)
    output_dir = Path(args.output_dir)
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    _report(metrics, output_dir)
    if args.predict:
        from training.predict import classify

        for text, (label, score) in zip(args.predict, classify(output_dir, args.predict), strict=True):
            print(f"prediction: {text!r} -> {label} ({score:.2f})")


if __name__ == "__main__":
    status = main()
    from training import hardware

    hardware.exit_process(status)  # a worker of a distributed group ends here (hardware.exit_process says why)
    sys.exit(status)
