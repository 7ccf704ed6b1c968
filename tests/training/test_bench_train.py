"""The Trainer step path's pieces (training/speed.py) and `make bench-train` (training/bench_train.py), on the CPU."""

from __future__ import annotations

import json
import math

import pytest

from training import bench_train, speed


def test_bucket_lengths_are_a_few_multiples_up_to_max_length():
    assert speed.bucket_lengths(128, 32) == [32, 64, 96, 128]
    assert speed.bucket_lengths(100, 32) == [32, 64, 96, 100]
    assert [speed.bucket_for(n, [32, 64, 96, 128]) for n in (1, 32, 33, 127, 128)] == [32, 32, 64, 128, 128]


def test_the_collator_pads_to_the_bucket_and_counts_useful_tokens():
    collate = speed.BucketCollator(pad_token_id=1, lengths=[8, 16])
    batch = collate([{"input_ids": [0, 5, 2], "labels": 1}, {"input_ids": list(range(10)), "labels": 2}])
    assert batch["input_ids"].shape == (2, 16) and batch["attention_mask"].sum() == 13
    assert batch["input_ids"][0, 3:].eq(1).all() and batch["labels"].tolist() == [1, 2]
    assert (collate.useful_tokens, collate.padded_tokens, collate.shapes) == (13, 32, {(2, 16)})


def test_the_collator_gives_the_tensors_of_row_by_row_padding():
    """Rows of every length up to past the largest bucket, as lists and as tensors: the same int64 tensors as padding
    each row in torch, one at a time (the collator before it filled numpy arrays)."""
    import random

    import torch

    def row_by_row(features, pad_token_id, lengths):
        width = speed.bucket_for(max(len(feature["input_ids"]) for feature in features), lengths)
        input_ids = torch.full((len(features), width), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(features), width), dtype=torch.long)
        for row, feature in enumerate(features):
            ids = feature["input_ids"][:width]
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        return input_ids, attention_mask, torch.tensor([int(feature["labels"]) for feature in features])

    generator = random.Random(0)
    lengths = speed.bucket_lengths(40, 16)  # [16, 32, 40]
    for trial in range(60):
        features = [{"input_ids": [generator.randrange(3, 500) for _ in range(generator.randrange(0, 48))],
                     "labels": generator.randrange(3)} for _ in range(generator.randrange(1, 9))]
        if trial % 2:
            features = [{"input_ids": torch.tensor(f["input_ids"], dtype=torch.long), "labels": torch.tensor(
                f["labels"])} for f in features]
        collate = speed.BucketCollator(pad_token_id=1, lengths=lengths, carry_counts=True)
        batch = collate(features)
        expected = row_by_row(features, 1, lengths)
        for name, tensor in zip(("input_ids", "attention_mask", "labels"), expected, strict=True):
            assert batch[name].dtype == torch.long and torch.equal(batch[name], tensor), (trial, name)
        rows, width = batch["input_ids"].shape
        assert batch[speed.PADDING_KEY] == (rows, width, int(expected[1].sum()))


def test_training_batches_are_whole_and_reshuffled_each_epoch():
    sampler = speed.TrainingBatches(rows=40, batch_size=16, seed=42)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert len(first) == len(second) == len(sampler) == 32  # two full batches; 8 rows sit out, others next epoch
    assert len(set(first)) == 32 and first != second and set(first) != set(second)
    assert len(speed.TrainingBatches(rows=10, batch_size=16, seed=0)) == 10  # fewer rows than a batch: one batch


def test_steady_state_leaves_out_warm_up_and_busy_steps():
    times = [5.0] * 10 + [0.1, 0.1, 9.0, 0.1, 0.2]
    figures = speed.steady_state(times, busy={13})
    assert figures == {"steps_measured": 4, "median_step_seconds": pytest.approx(0.1)}
    assert speed.steady_state([1.0] * 5, busy=set())["steps_measured"] == 0


def test_mfu_counts_roberta_base_training_flops_against_the_peak():
    base = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
    per_token = bench_train.training_flops_per_token(base, 128)
    assert 6 * 85e6 < per_token < 6 * 87e6 + 12 * 12 * 768 * 128 + 1e6  # about 85 M non-embedding parameters
    assert bench_train.peak_flops("NVIDIA H200") == bench_train.peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert bench_train.peak_flops("NVIDIA A100-SXM4-40GB") == 312e12 and bench_train.peak_flops("Tesla T4") is None
    timing = {"samples_per_second": 100.0, "padded_tokens_per_row": 128.0, "padded_tokens_per_second": 12800.0,
              "useful_tokens_per_second": 3200.0, "config": base}
    executed, useful = bench_train.mfu(timing, 312e12)
    assert executed == pytest.approx(12800 * per_token / 312e12) and useful == pytest.approx(executed / 4)
    assert bench_train.mfu({**timing, "samples_per_second": math.nan}, 312e12) == (None, None)


def test_length_buckets_leave_predictions_on_the_sample_unchanged(trained):
    """Padding is masked out (and RoBERTa numbers positions from the real tokens), so a batch padded to its bucket
    gives the model's answers for max-length padding: same predictions, logits equal to rounding, same accuracy.
    (Two training runs with different padding differ by their dropout masks' random draws, not by the padding.)"""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from training.data import load_splits, sample_source

    assert trained.exit_code == 0
    model = AutoModelForSequenceClassification.from_pretrained(trained.output_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(trained.output_dir)
    validation = load_splits(sample_source())["validation"]
    rows = [{"input_ids": ids, "labels": label} for ids, label in
            zip(tokenizer(validation["text"], truncation=True, max_length=32)["input_ids"], validation["label"],
                strict=True)]
    logits = {}
    for name, lengths in (("max-length", [32]), ("buckets", speed.bucket_lengths(32, 8))):
        collate = speed.BucketCollator(tokenizer.pad_token_id, lengths)
        with torch.no_grad():
            batches = [collate(rows[i:i + 16]) for i in range(0, len(rows), 16)]
            logits[name] = torch.cat([model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
                                      for b in batches])
        if name == "buckets":
            assert collate.padded_tokens < len(rows) * 32  # fewer tokens computed
    assert torch.allclose(logits["buckets"], logits["max-length"], atol=1e-4)
    assert logits["buckets"].argmax(-1).tolist() == logits["max-length"].argmax(-1).tolist()
    accuracy = (logits["buckets"].argmax(-1) == torch.tensor(validation["label"])).float().mean().item()
    assert accuracy == pytest.approx(trained.metrics["validation"]["accuracy"], abs=1e-6)


@pytest.mark.slow
def test_bench_train_runs_plain_and_optimized_through_torchrun(tmp_path, capsys):
    """A reduced `make bench-train`: one copy of the sample, two variants, Dynamo's eager backend, no bare loop."""
    out = tmp_path / "bench.json"
    code = bench_train.main(["--repeat", "1", "--only", "plain,optimized+buckets", "--no-bare-loop",
                             "--compile-backend", "eager", "--max-length", "32", "--bucket-size", "8",
                             "--loss-check", "--work-dir", str(tmp_path / "work"), "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    figures = json.loads(out.read_text())
    plain, buckets = figures["results"]["plain"], figures["results"]["optimized+buckets"]
    assert plain["steps"] == buckets["steps"] == 2 * (266 // 16)  # two epochs of whole batches
    assert plain["steps_measured"] > 0 and buckets["compile"]["unique_graphs"] == len(buckets["training_shapes"])
    assert plain["compile"] is None and plain["lengths"] == [32]
    # One torchrun process on a CPU trains the model itself, as one process on a GPU does: accelerate would wrap it in
    # DistributedDataParallel (training.hardware.lone_cpu_process).
    assert plain["wrapped_model"] == ["RobertaForSequenceClassification"], plain["wrapped_model"]
    assert buckets["wrapped_model"] == ["OptimizedModule", "RobertaForSequenceClassification"]
    assert buckets["padded_tokens_per_row"] < plain["padded_tokens_per_row"]
    assert "MFU: against nothing on a CPU" in printed
    # The Trainer's host work per step, piece by piece: what the run trimmed stays trimmed.
    for run in (plain, buckets):
        pieces = run["host_pieces"]
        assert pieces["floating_point_ops (total_flos)"]["calls_per_step"] == 1.0
        assert pieces["  model.train()"]["calls_per_step"] < 0.1, pieces  # only after the epoch's evaluation
        assert run["median_between_steps_seconds"] > 0 and run["median_device_wait_seconds"] >= 0
    assert "host ms per step" in printed and "next batch" in printed
    rows = [line.split()[0] for line in printed.splitlines() if line.startswith(("plain ", "optimized+buckets "))]
    assert rows == ["plain", "optimized+buckets"], printed
    # What proves a step device-bound, as a CPU can say it: the profiler's op time beside the step, no CUDA graphs.
    for name, run in (("plain", plain), ("optimized+buckets", buckets)):
        assert run["profile"]["kernel_ms_per_step"] > 0 and run["profile"]["steps"] == 5
        assert f"{name}: step " in printed
    assert printed.count("CUDA graphs: n/a on CPU") == 2
    assert "6 x non-embedding parameters + 12 x layers x width x sequence" in printed
    # The loss check: 50 steps with dropout off, eager and compiled (Dynamo's eager backend here), agree.
    check = figures["loss_check"]
    assert check["passed"] and [run["steps"] for run in check["runs"]] == [50, 50]
    assert "loss check after 50 steps, dropout off" in printed and printed.rstrip().endswith(": pass")


def test_the_report_shows_the_trainer_step_against_the_bare_loop_step_and_the_host_pieces():
    """The figures of the H200 run before this change: the Trainer's optimized step was 9.4 ms over the bare loop's."""
    pieces = {"next batch (data loader, collate, copy to device)": {"median_ms": 1.5, "calls_per_step": 1.0},
              "  model.train()": {"median_ms": 0.9, "calls_per_step": 0.01}}
    plain = {"median_step_seconds": 0.03865, "median_between_steps_seconds": 0.002, "host_pieces": pieces,
             "median_device_wait_seconds": 0.0301}
    optimized = {**plain, "median_step_seconds": 0.03160}
    bare = {"settings": {"batch_size": 16}, "results": [
        {"samples_per_second": 414.6}, {"samples_per_second": 719.1, "host_ms": {
            "forward": 5.0, "backward": 6.0, "optimizer.step": 1.0, "zero_grad": 0.5, "device wait": 9.7}}]}
    lines = bench_train.host_overhead(plain, optimized, bare)
    assert "plain +0.06 ms (38.65 against 38.59), optimized +9.35 ms (31.60 against 22.25)" in lines[0]
    assert lines[1].endswith("plain 2.00 ms, optimized 2.00 ms")
    rows = {line[:56].strip(): line.split()[-2:] for line in lines[3:5]}
    assert rows == {"next batch (data loader, collate, copy to device)": ["1.500", "1.500"],
                    "model.train()": ["0.009", "0.009"]}
    assert lines[-1].split()[-3:] == ["30.100", "30.100", "9.700"]  # the Trainer's and the bare loop's device waits
    assert lines[2].split()[-2:] == ["bare", "optimized"] and "bare plain" not in lines[2]  # no phases for plain
    assert bench_train.host_overhead(None, None, bare) == []


def test_an_unknown_variant_is_one_line_and_exit_status_2(capsys):
    assert bench_train.main(["--only", "fastest"]) == 2
    assert "--only fastest: unknown variant(s) fastest" in capsys.readouterr().err


def test_narrow_base_has_roberta_base_structure_at_the_tiny_width_in_both_loops():
    """The CPU proxy for a host-bound base step: the Trainer's model and the bare loop's have base's 12 layers and so
    its parameter tensors (each a per-tensor call in clipping, zeroing and the optimizer) at the tiny width."""
    import torch
    from transformers import RobertaForSequenceClassification

    from training import benchmark, tiny

    tokenizer = tiny.build_tokenizer(["a tweet about nothing much"] * 20)
    trainer_model = tiny.build_model(tokenizer, max_length=16, name=tiny.NARROW_BASE_MODEL_NAME)
    bare_model = RobertaForSequenceClassification(benchmark.model_config(bench_train.BARE_LOOP_SIZES["narrow-base"]))
    with torch.device("meta"):  # shapes only: no 125 M parameters allocated
        base_tensors = len(list(RobertaForSequenceClassification(benchmark.model_config("base")).parameters()))
    for model in (trainer_model, bare_model):
        assert len(list(model.parameters())) == base_tensors
        assert model.config.num_hidden_layers == 12 and model.config.hidden_size == 64
    assert len(list(tiny.build_model(tokenizer, max_length=16).parameters())) < base_tensors
    # Every model bench_train offers has a bare loop of the same shape.
    assert set(bench_train.BARE_LOOP_SIZES) == set(tiny.LOCAL_MODELS)


def test_a_failed_variant_is_reported_and_the_others_still_run(monkeypatch, tmp_path, capsys):
    """On a lent GPU a CUDA graph skip is an error (TORCHINDUCTOR_CUDAGRAPH_OR_ERROR): that variant's failure must not
    cost the figures of the others, and the exit status says something failed."""
    tried = []

    def launch(variant, *args):
        tried.append(variant.name)
        raise RuntimeError(f"{variant.name}: train_sentiment exited with 1\nskipping cudagraphs due to ...")

    monkeypatch.setattr(bench_train, "launch", launch)
    out = tmp_path / "bench.json"
    code = bench_train.main(["--only", "plain,optimized", "--no-bare-loop", "--loss-check", "--json", str(out),
                             "--work-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 1
    assert tried == ["plain", "optimized", "loss-check-eager"]  # every variant tried; the loss check stops at one
    assert "FAILED: plain" in captured.out and "FAILED: loss check" in captured.out
    assert "skipping cudagraphs" in captured.err
    assert set(json.loads(out.read_text())["failed"]) == {"plain", "optimized", "loss check"}
