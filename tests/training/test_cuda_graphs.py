"""CUDA graphs through the Trainer (issue 42), on the CPU: the mode each device gets, the refusals, what accelerate
compiles with, the evaluation path when outputs are overwritten by the next replay, dropout off, and the report."""

from __future__ import annotations

import os

import pytest

from tests.training.conftest import sample_args
from training import bench_train, cuda_graphs


@pytest.mark.parametrize(("requested", "device", "compiled", "world_size", "expected"), [
    ("auto", "cuda", True, 1, "reduce-overhead"),
    ("auto", "cuda", True, 8, None),  # the p4d's DDP: not until a multi-GPU run has measured it
    ("reduce-overhead", "cuda", True, 8, "reduce-overhead"),
    ("auto", "cpu", True, 1, None),
    ("auto", "cuda", False, 1, None),
    ("default", "cuda", True, 1, None),
    ("max-autotune", "cpu", True, 1, "max-autotune"),
    ("max-autotune-no-cudagraphs", "cuda", True, 1, "max-autotune-no-cudagraphs"),
])  # fmt: skip
def test_auto_means_cuda_graphs_in_one_process_on_a_gpu_only(requested, device, compiled, world_size, expected):
    mode = cuda_graphs.resolve_mode(requested, device, compiled, world_size)
    assert mode == expected
    assert cuda_graphs.records_graphs(mode) is (expected in ("reduce-overhead", "max-autotune"))


@pytest.mark.parametrize(("settings", "named"), [
    ({"gradient_accumulation_steps": 4}, "--gradient-accumulation-steps 4 with --torch-compile-mode reduce-overhead"),
    ({"learning_rate": "tensor"}, "--learning-rate tensor(1.0000e-05) with --torch-compile-mode reduce-overhead"),
    ({"backend": "aot_eager"}, "needs --torch-compile-backend inductor, got 'aot_eager'"),
])  # fmt: skip
def test_what_a_replay_would_get_wrong_is_refused_with_the_settings_named(settings, named):
    import torch

    given = {"backend": "inductor", "gradient_accumulation_steps": 1, "learning_rate": 1e-5, **settings}
    if given["learning_rate"] == "tensor":
        given["learning_rate"] = torch.tensor(1e-5)
    with pytest.raises(cuda_graphs.GraphConflict, match=r"allowed|only|needs") as refused:
        cuda_graphs.check("reduce-overhead", **given)
    assert named in str(refused.value) and "\n" not in str(refused.value)
    cuda_graphs.check("default", **given)  # no graphs: nothing to refuse
    cuda_graphs.check(None, **given)


def test_the_cli_refuses_accumulation_with_graphs_in_one_line(tmp_path, capsys):
    from training import train_sentiment

    argv = sample_args(tmp_path / "model", "--torch-compile", "--torch-compile-mode", "reduce-overhead",
                       "--gradient-accumulation-steps", "2")
    argv.remove("--no-torch-compile")
    assert train_sentiment.main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("python -m training.train_sentiment: error: --gradient-accumulation-steps 2 with")
    assert len(error.splitlines()) == 1 and "allowed: 1" in error
    assert not (tmp_path / "model").exists()


def test_the_trainer_compiles_with_the_mode_full_graph_and_static_shapes(tmp_path):
    """transformers 5.20 builds accelerate's TorchDynamoPlugin from TrainingArguments and the environment; these are
    the keyword arguments accelerate's prepare_model hands to torch.compile."""
    from transformers import Trainer, TrainingArguments

    from training import tiny

    tokenizer = tiny.build_tokenizer(["a few words", "and a few more"], model_max_length=16)
    model = tiny.build_model(tokenizer, max_length=16)
    arguments = TrainingArguments(output_dir=str(tmp_path), torch_compile_mode="reduce-overhead", use_cpu=True,
                                  report_to="none")
    before = {name: os.environ.get(name) for name in (cuda_graphs.FULLGRAPH_VARIABLE, cuda_graphs.DYNAMIC_VARIABLE)}
    with cuda_graphs.dynamo_plugin_environment(True, world_size=1):
        trainer = Trainer(model=model, args=arguments)
    assert trainer.accelerator.state.dynamo_plugin.to_kwargs() == {
        "backend": "inductor", "mode": "reduce-overhead", "fullgraph": True, "dynamic": False}
    # Several processes: DDP's wrapper breaks the graph by design (tests/training/test_distributed.py compiles it).
    arguments = TrainingArguments(output_dir=str(tmp_path), torch_compile_mode="reduce-overhead", use_cpu=True,
                                  report_to="none")  # new arguments: accelerate's state starts again
    with cuda_graphs.dynamo_plugin_environment(True, world_size=8):
        trainer = Trainer(model=model, args=arguments)
    assert trainer.accelerator.state.dynamo_plugin.to_kwargs() == {
        "backend": "inductor", "mode": "reduce-overhead", "dynamic": False}
    assert {name: os.environ.get(name) for name in before} == before  # nothing left behind in the process


def _replays_into_the_same_outputs(gm, example_inputs):
    """A Dynamo backend whose compiled function hands back the same output tensors at every call, refilled: what a
    CUDA graph replay does with its static output memory (torch.compiler_cudagraph_trees, "Limitations": an output
    kept past the next replay is overwritten). The arithmetic is the graph's own."""
    kept = []

    def replay(*inputs):
        fresh = gm(*inputs)
        if not kept:
            kept.extend(fresh)
        else:
            for slot, value in zip(kept, fresh, strict=True):
                slot.copy_(value)
        return tuple(kept)

    return replay


@pytest.mark.parametrize("clone", [True, False])
def test_evaluation_reports_what_eager_reports_when_each_replay_overwrites_the_last_outputs(tmp_path, clone):
    import numpy as np
    import torch
    from transformers import TrainingArguments

    from training import speed, tiny
    from training.data import load_splits, sample_source
    from training.train_sentiment import _encode

    splits = load_splits(sample_source())
    tokenizer = tiny.build_tokenizer(splits["train"]["text"], model_max_length=32)
    model = tiny.build_model(tokenizer, max_length=32).eval()
    dataset = _encode(tokenizer, splits["validation"], 32)
    lengths = [32]  # one shape: every batch replays the same graph (the last, shorter batch gets one of its own)
    # The columns and the label name given: the Trainer reads them from the model's forward, and a compiled module's
    # forward takes (*args, **kwargs).
    arguments = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=8, use_cpu=True,
                                  report_to="none", remove_unused_columns=False, label_names=["labels"])

    def predictions(evaluated, reused: bool):
        trainer = speed.recipe_trainer(speed.BucketCollator(tokenizer.pad_token_id, lengths))(
            model=evaluated, args=arguments, data_collator=speed.BucketCollator(tokenizer.pad_token_id, lengths))
        trainer.graph_outputs_reused = reused
        return trainer.predict(dataset).predictions

    eager = predictions(model, reused=False)
    torch._dynamo.reset()
    replayed = torch.compile(model, backend=_replays_into_the_same_outputs, dynamic=False)
    compiled = predictions(replayed, reused=clone)
    assert compiled.shape == eager.shape == (57, 3)
    if clone:
        np.testing.assert_allclose(compiled, eager, atol=1e-5)
    else:  # what evaluation would report without the copies: earlier batches overwritten by later ones
        assert not np.allclose(compiled, eager, atol=1e-5)


def test_dropout_off_makes_training_mode_deterministic():
    import torch

    from training import tiny
    from training.train_sentiment import set_dropout

    tokenizer = tiny.build_tokenizer(["one text here", "another text"], model_max_length=16)
    model = tiny.build_model(tokenizer, max_length=16).train()
    batch = tokenizer(["one text here", "another text"], padding=True, return_tensors="pt")
    torch.manual_seed(0)
    assert not torch.equal(model(**batch).logits, model(**batch).logits)  # dropout on: two draws differ
    set_dropout(model, 0.0)
    assert torch.equal(model(**batch).logits, model(**batch).logits)
    assert all(module.p == 0.0 for module in model.modules() if isinstance(module, torch.nn.Dropout))
    assert model.config.hidden_dropout_prob == model.config.attention_probs_dropout_prob == 0.0


def test_the_loss_check_passes_within_bf16_tolerance_and_fails_beyond_it():
    eager = {"train_loss": 1.0986, "validation": {"loss": 1.0952}}
    passed, line = bench_train.loss_check(eager, {"train_loss": 1.1001, "validation": {"loss": 1.0949}})
    assert passed and line.endswith(": pass") and "largest difference 0.0015" in line
    passed, line = bench_train.loss_check(eager, {"train_loss": 1.0986, "validation": {"loss": 1.1452}})
    assert not passed and line.endswith(": FAIL") and "0.0500 > 0.02" in line
    # The two runs differ only in the compiler: the same precision, optimizer, dropout and steps.
    first, second = (set(variant.flags) for variant in bench_train.loss_check_variants("inductor", "auto"))
    assert first ^ second == {"--no-torch-compile", "--torch-compile", "--torch-compile-backend", "inductor",
                              "--torch-compile-mode", "auto"}
    assert {"--dropout", "0", "--bf16", "--max-steps", "50"} <= first & second


def _timing(device: str, step_ms: float, kernel_ms: float, graphs: dict) -> dict:
    return {"device": device, "median_step_seconds": step_ms / 1000, "training_shapes": [[16, 128]],
            "compile": {"unique_graphs": 1, "cuda_graphs": graphs},
            "profile": {"steps": 5, "kernel_ms_per_step": kernel_ms, "graph_launches_per_step": 2.0,
                        "kernel_time": "device kernels" if device == "cuda" else "CPU ops' self time (profiler)"}}


def test_the_report_calls_a_step_device_bound_only_within_1_2x_of_its_kernels():
    graphs = {"applies": True, "skips": 0, "skip_reasons": []}
    lines = bench_train.device_bound({"optimized": _timing("cuda", 11.0, 10.0, graphs),
                                      "plain": _timing("cuda", 38.6, 12.0, {"applies": False, "why": "no"}),
                                      "cpu": _timing("cpu", 5.0, 2.0, {"applies": False, "why": "n/a on CPU"})})
    assert lines[0] == ("optimized: step 11.00 ms, device kernels 10.00 ms per step over 5 steps (1.10x: "
                        "device-bound); CUDA graphs: 2.0 replays per step, 0 skipped; graphs per training shape 1.0")
    assert "(3.22x: host-bound (over 1.2x)); CUDA graphs: off (no)" in lines[1]
    assert "a CPU's op time, not a device's kernels); CUDA graphs: n/a on CPU" in lines[2]
    # A profiler that could not start costs the figure, and says why.
    broken = {**_timing("cuda", 11.0, 10.0, graphs), "profile": {"error": "RuntimeError: CUPTI busy"}}
    assert bench_train.device_bound({"optimized": broken}) == [
        "optimized: no profile (RuntimeError: CUPTI busy); CUDA graphs: n/a replays per step, 0 skipped; graphs per "
        "training shape 1.0"]


def test_the_bare_loop_refuses_graphs_with_a_backend_that_records_none(capsys):
    from training import benchmark

    assert benchmark.main(["--compile-mode", "reduce-overhead", "--compile-backend", "eager", "--steps", "1"]) == 2
    error = capsys.readouterr().err
    assert "--compile-mode reduce-overhead needs --compile-backend inductor, got 'eager'" in error


def test_a_profiled_trainer_run_writes_the_kernel_time_and_leaves_those_steps_out(tmp_path):
    """The Trainer path with the step timer's profile on a CPU: the profiled steps' time is the profiler's, so they
    are not among the steps measured."""
    import json

    from training import train_sentiment

    timing = tmp_path / "timing.json"
    # 200 rows: 12 steps an epoch, evaluation after step 12 (step 13 left out); steps 11 to 15 profiled.
    argv = sample_args(tmp_path / "model", "--max-steps", "16", "--step-timing", str(timing), "--profile-from", "11",
                       "--max-train-samples", "200", "--save-strategy", "epoch")
    assert train_sentiment.main(argv) == 0
    figures = json.loads(timing.read_text())
    profile = figures["profile"]
    assert profile["first_step"] == 11 and profile["steps"] == 5 and profile["kernel_ms_per_step"] > 0
    assert profile["graph_launches_per_step"] is None and profile["kernel_time"].startswith("CPU")
    assert figures["steps"] == 16 and figures["steps_measured"] == 1  # step 16 alone


def test_a_profiler_that_cannot_start_costs_the_figure_not_the_run(tmp_path, monkeypatch):
    import json

    import torch

    from training import train_sentiment

    def refuse(*args, **kwargs):
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    timing = tmp_path / "timing.json"
    argv = sample_args(tmp_path / "model", "--max-steps", "12", "--step-timing", str(timing), "--profile-from", "11",
                       "--max-train-samples", "200")
    assert train_sentiment.main(argv) == 0
    figures = json.loads(timing.read_text())
    assert figures["profile"] == {"error": "RuntimeError: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"}
    assert figures["steps"] == 12 and figures["steps_measured"] == 2  # steps 11 and 12 were not profiled after all
