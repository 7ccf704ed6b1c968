"""The recipe's torch.compile path through the Trainer, on the CPU (the first compile takes about a minute)."""

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
    argv = sample_args(output, "--torch-compile", "--max-steps", "3", "--max-length", "16")
    assert train_sentiment.main(argv) == 0
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["effective"]["torch_compile"] is True
    with safe_open(output / "model.safetensors", framework="pt") as weights:
        keys = list(weights.keys())
    assert keys and not any("_orig_mod" in key for key in keys), "compiled wrapper leaked into the weights"
    assert AutoModelForSequenceClassification.from_pretrained(output).config.num_labels == 3
