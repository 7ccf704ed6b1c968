"""The host work RecipeTrainer (training/speed.py) removes from every step stays removed, and what it kept still works.

A real Trainer loop (transformers' `_run_epoch`) on the tiny model for two short epochs with evaluation between them,
with spies on the model: cheap (a few seconds), no compile.
"""

from __future__ import annotations

import multiprocessing

import pytest

from training import speed

ROWS, BATCH, EPOCHS = 48, 16, 2  # 3 steps an epoch


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Train the tiny model through RecipeTrainer with spies on `num_parameters` and `train`; what they saw."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback, TrainingArguments

    from training import tiny
    from training.data import load_splits, sample_source

    torch.set_num_threads(1)
    split = load_splits(sample_source())["train"]
    tokenizer = tiny.build_tokenizer(split["text"], model_max_length=32)
    model = tiny.build_model(tokenizer, max_length=32)
    ids = tokenizer(split["text"][:ROWS], truncation=True, max_length=32)["input_ids"]
    dataset = Dataset.from_dict({"input_ids": ids, "labels": split["label"][:ROWS]})

    seen = {"num_parameters": 0, "train_walks": [], "steps": [], "not_training": [], "parameter_walks": 0,
            "walks_at_step_end": [], "gradients_left": []}
    count_parameters = model.num_parameters

    def num_parameters(*args, **kwargs):
        seen["num_parameters"] += 1
        return count_parameters(*args, **kwargs)

    walk = type(model).train.__get__(model)

    def train(mode=True):
        seen["train_walks"].append(mode)
        return walk(mode)

    parameters = type(model).parameters.__get__(model)

    def parameter_walk(*args, **kwargs):  # nn.Module.zero_grad walks `self.parameters()` at every call
        seen["parameter_walks"] += 1
        return parameters(*args, **kwargs)

    # Instance attributes, as the Trainer (no compile, one process) calls them on this very object.
    vars(model)["num_parameters"] = num_parameters
    vars(model)["train"] = train
    vars(model)["parameters"] = parameter_walk

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen["steps"].append(state.global_step)
            seen["not_training"] += [name for name, module in model.named_modules() if not module.training]
            # After the optimizer step and `model.zero_grad()`: how often the parameters were walked so far.
            seen["walks_at_step_end"].append(seen["parameter_walks"])
            seen["gradients_left"].append(sum(p.grad is not None for p in parameters()))

    collator = speed.BucketCollator(tokenizer.pad_token_id, [16, 32])
    args = TrainingArguments(output_dir=str(tmp_path_factory.mktemp("step-path")), per_device_train_batch_size=BATCH,
                             per_device_eval_batch_size=BATCH, num_train_epochs=EPOCHS, eval_strategy="epoch",
                             save_strategy="no", logging_strategy="epoch", use_cpu=True, report_to="none",
                             disable_tqdm=True, seed=0,
                             # As with --dataloader-workers 1: the collator runs in another process.
                             dataloader_num_workers=1, dataloader_persistent_workers=True)
    trainer = speed.recipe_trainer(collator)(model=model, args=args, train_dataset=dataset, eval_dataset=dataset,
                                             data_collator=speed.BucketCollator(tokenizer.pad_token_id, [16, 32]),
                                             callbacks=[Watch()])
    parameters_before = seen["num_parameters"]
    children_before = set(multiprocessing.active_children())
    trainer.train()
    seen["num_parameters"] -= parameters_before
    yield trainer, collator, seen, count_parameters(exclude_embeddings=True)
    stop_loader_workers(trainer)
    assert set(multiprocessing.active_children()) <= children_before, "a data loader worker outlived the module"


def stop_loader_workers(trainer) -> None:
    """Stop the persistent data loader workers now, not when the garbage collector frees the trainer's cycles.

    torch stops them in the iterator's `__del__` (torch/utils/data/dataloader.py). When that collection falls in
    pytest-xdist's worker shutdown, each join waits out its 5 s timeout and xdist kills the worker after 10 s: seen as
    14 s at the end of some `make test` runs. Called here it takes milliseconds."""
    loaders = [*trainer.accelerator._dataloaders, *getattr(trainer, "_eval_dataloaders", {}).values()]
    for loader in loaders:
        if getattr(loader, "_iterator", None) is not None:
            loader._iterator._shutdown_workers()
            loader._iterator = None


def test_the_parameter_count_for_total_flos_is_taken_once_and_total_flos_is_unchanged(run):
    trainer, _, seen, non_embedding = run
    steps = len(seen["steps"])
    assert steps == EPOCHS * ROWS // BATCH
    # transformers 5.20 counts at every step (Trainer.floating_point_ops -> num_parameters(exclude_embeddings=True)).
    assert seen["num_parameters"] == 1, seen["num_parameters"]
    assert trainer.state.total_flos == 6 * trainer.padding.padded_tokens * non_embedding


def test_train_mode_is_set_only_after_evaluation_and_every_step_trains_in_train_mode(run):
    _, _, seen, _ = run
    # transformers calls model.train() at every step (6 here). The model is built in training mode, so only the step
    # after the evaluation between the epochs walks the modules; the evaluations put it in eval mode.
    assert seen["train_walks"] == [False, True, False], seen["train_walks"]
    assert seen["not_training"] == []  # yet every step ran with every module in training mode


def test_gradients_are_cleared_at_every_step_without_walking_the_modules(run):
    trainer, _, seen, _ = run
    assert seen["gradients_left"] == [0] * len(seen["steps"])
    # transformers 5.20 calls `model.zero_grad()` (a walk over `parameters()`) after every optimizer step; from the
    # second step of each epoch on, nothing walks the parameters any more (the first step's walks: the clipping's
    # one-time check, and the train/eval switch after an evaluation).
    walks = seen["walks_at_step_end"]
    per_epoch = len(walks) // EPOCHS
    for epoch in range(EPOCHS):
        later_steps = walks[epoch * per_epoch + 1: (epoch + 1) * per_epoch]
        assert len(set(later_steps)) == 1, walks
    assert "zero_grad" not in vars(trainer.model_wrapped)  # the list version is gone after train()


def test_zero_grad_by_list_clears_like_the_module_walk_and_zeroes_through_it():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    model(torch.ones(4, 3)).sum().backward()
    zero_grad = speed.zero_grad_by_list(model)
    zero_grad(set_to_none=False)  # the walk, as nn.Module.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_clipping_equals_accelerates_and_falls_back_where_it_does_not_apply(run):
    """RecipeTrainer's clipping gives accelerate's norm and clipped gradients exactly (the tiny model, one dtype);
    with parameters of two dtypes it leaves the work to transformers and accelerate."""
    import copy

    import torch

    trainer, _, _, _ = run

    def copied():  # without the fixture's spies, whose `parameters` would still walk the original model
        model = copy.deepcopy(trainer.model_wrapped)
        for spy in ("parameters", "train", "num_parameters"):
            vars(model).pop(spy, None)
        return model

    model, twin = copied(), copied()
    generator = torch.Generator().manual_seed(0)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        p.grad = torch.randn(p.shape, generator=generator) * 10
        q.grad = p.grad.clone()
    ours = trainer._clip_grad_norm(model)
    theirs = trainer.accelerator.clip_grad_norm_(twin.parameters(), trainer.args.max_grad_norm)
    assert trainer._clip_parameters[1] is not None  # the fast path ran
    assert torch.equal(ours, theirs) and ours > trainer.args.max_grad_norm  # so the gradients were scaled
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), twin.parameters(), strict=True))

    mixed = copied()
    mixed.classifier.out_proj.to(torch.bfloat16)
    for p in mixed.parameters():
        p.grad = torch.ones_like(p)
    trainer._clip_parameters = None
    norm = trainer._clip_grad_norm(mixed)
    assert trainer._clip_parameters == (id(mixed), None)  # checked, and left to accelerate
    assert norm > 0


def test_training_batches_are_tallied_in_the_trainer_and_the_model_never_sees_the_counts(run):
    trainer, collator, seen, _ = run
    steps = len(seen["steps"])
    assert trainer.padding.rows == steps * BATCH
    assert collator.rows == 0  # the worker process collated (and counted there)
    assert trainer.padding.shapes and trainer.padding.useful_tokens < trainer.padding.padded_tokens


def test_counts_cross_a_worker_process_with_the_batch():
    """In a data loader worker the collator's own counts stay in the worker; the batch brings them to the step."""
    import torch

    collator = speed.BucketCollator(pad_token_id=1, lengths=[8, 16], carry_counts=True)
    rows = [{"input_ids": list(range(n)), "labels": 0} for n in (3, 10, 5, 7)]
    loader = torch.utils.data.DataLoader(rows, batch_size=2, collate_fn=collator, num_workers=1,
                                         multiprocessing_context="fork")
    carried = [batch[speed.PADDING_KEY] for batch in loader]
    assert carried == [(2, 16, 13), (2, 8, 12)]
    assert collator.rows == 0  # counted in the worker, not here


def test_the_training_process_collates_unless_workers_are_asked_for(tmp_path):
    from training import hardware, train_sentiment

    assert speed.data_loader(0) == {"dataloader_num_workers": 0}
    assert speed.data_loader(2) == {"dataloader_num_workers": 2, "dataloader_persistent_workers": True,
                                    "dataloader_prefetch_factor": 2}
    for device in ("cpu", "cuda"):
        plan = hardware.Plan(device=device, bf16=False, torch_compile=False, fused_adamw=False, tf32=None)
        for flags, workers in (([], 0), (["--dataloader-workers", "3"], 3)):
            args = train_sentiment.build_parser().parse_args(["--no-torch-compile", *flags])
            made = train_sentiment._training_arguments(args, plan, tmp_path, None)
            assert made.dataloader_num_workers == workers and made.dataloader_persistent_workers == (workers > 0)
            assert made.dataloader_pin_memory == (device == "cuda")


def test_host_clock_times_the_step_path_pieces_and_survives_a_checkpoint(tmp_path):
    """HostClock wraps methods on the instances; a checkpoint (optimizer, scheduler, RNG, trainer state) still saves."""
    import torch
    from datasets import Dataset
    from transformers import TrainingArguments

    from training import tiny

    torch.set_num_threads(1)
    texts = ["good day", "bad day", "a day"] * 16
    tokenizer = tiny.build_tokenizer(texts, model_max_length=16)
    model = tiny.build_model(tokenizer, max_length=16)
    dataset = Dataset.from_dict({"input_ids": tokenizer(texts)["input_ids"], "labels": [2, 0, 1] * 16})
    timer = speed.make_step_timer("cpu")
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=16, max_steps=3,
                             save_strategy="steps", save_steps=3, use_cpu=True, report_to="none", disable_tqdm=True)
    trainer = speed.recipe_trainer(speed.BucketCollator(tokenizer.pad_token_id, [16]))(
        model=model, args=args, train_dataset=dataset, callbacks=[timer],
        data_collator=speed.BucketCollator(tokenizer.pad_token_id, [16]))
    timer.attach(trainer)
    trainer.train()
    pieces = timer.host.summary(len(timer.times))
    assert (tmp_path / "checkpoint-3" / "optimizer.pt").is_file()
    for label in ("next batch (data loader, collate, copy to device)", "  forward (compute_loss)", "  backward",
                  "optimizer.step", "floating_point_ops (total_flos)"):
        assert pieces[label]["calls_per_step"] == pytest.approx(1.0, abs=0.34), (label, pieces)
        assert pieces[label]["median_ms"] >= 0
    assert len(timer.between) == len(timer.times) == 3
