"""The recipe's torch.compile path through the Trainer, on the CPU (the first compile takes about a minute), in the
mode a GPU runs (reduce-overhead: CUDA graphs, which a CPU skips)."""

from __future__ import annotations

import json

import pytest

from tests.training.conftest import sample_args


@pytest.mark.slow
def test_compiled_training_saves_a_model_that_reloads(tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification

    from training import train_sentiment

    output = tmp_path / "model"
    # The GPU's mode (CUDA graphs) through inductor: on a CPU, inductor compiles and skips the graphs for CPU tensors.
    argv = sample_args(output, "--torch-compile", "--torch-compile-mode", "reduce-overhead", "--max-steps", "3",
                       "--max-length", "16")
    assert train_sentiment.main(argv) == 0
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["effective"]["torch_compile"] is True
    assert metrics["effective"]["torch_compile_mode"] == metrics["compile"]["mode"] == "reduce-overhead"
    graphs = metrics["compile"]["cuda_graphs"]
    # inductor counted the graphs it did not record (torch's own counter): the mode reached it, and a CPU has none.
    assert graphs["applies"] is False and graphs["why"] == "n/a on CPU" and graphs["skips"] >= 1, graphs
    with safe_open(output / "model.safetensors", framework="pt") as weights:
        keys = list(weights.keys())
    assert keys and not any("_orig_mod" in key for key in keys), "compiled wrapper leaked into the weights"
    assert AutoModelForSequenceClassification.from_pretrained(output).config.num_labels == 3


def test_two_epochs_with_a_partial_batch_and_evaluation_compile_once_per_bucket(tmp_path):
    """Dynamo's own records: one graph per training bucket shape, no recompile for problem_type or the last batch.

    backend="eager" runs Dynamo's capture, guards and recompiles exactly as inductor does (recompiles are Dynamo's
    decision, before any backend sees a graph) without inductor's C++ builds (about a minute on a cold cache).
    The model comes from a directory through from_pretrained, with `problem_type` unset in its config, as a hub
    checkpoint has it: the path whose first forward used to set it and compile again.
    """
    from training import tiny, train_sentiment
    from training.data import load_splits, sample_source

    texts = load_splits(sample_source())["train"]["text"]
    tokenizer = tiny.build_tokenizer(texts, model_max_length=32)
    model = tiny.build_model(tokenizer, max_length=32)
    model.config.problem_type = None
    pretrained = tmp_path / "pretrained"
    model.save_pretrained(pretrained)
    tokenizer.save_pretrained(pretrained)

    output = tmp_path / "model"
    argv = sample_args(output, "--torch-compile", "--torch-compile-backend", "eager", "--no-bf16")
    argv[argv.index("tiny")] = str(pretrained)
    argv[argv.index("--num-train-epochs") + 1] = "2"
    # 40 rows in batches of 16: two full batches and a partial one of 8 each epoch; 57 validation rows (16+16+16+9).
    argv += ["--max-train-samples", "40", "--bucket-size", "8", "--save-strategy", "epoch"]
    assert train_sentiment.main(argv) == 0
    metrics = json.loads((output / "metrics.json").read_text())
    shapes = {tuple(shape) for shape in metrics["padding"]["training_shapes"]}
    compiled = metrics["compile"]
    assert {batch for batch, _ in shapes} == {16}, "the partial training batch was not dropped"
    assert len(shapes) >= 2, shapes  # these rows (9 to 25 tokens) need more than one of the lengths 8, 16, 24, 32
    assert compiled["unique_graphs"] == len(shapes), compiled
    assert compiled["recompiles"] == len(shapes) - 1, compiled
    for reason in compiled["recompile_reasons"]:
        assert "problem_type" not in reason and "size mismatch at index 1" in reason, reason
    assert metrics["examples"]["validation"] == 57 and metrics["validation"]["accuracy"] is not None
