"""The training program end to end on the tiny model: outputs, reload, resume, launch guard."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from tests.training.conftest import COVID, SAMPLE, sample_args
from training import LABELS

SCORES = ("accuracy", "recall_macro", "f1_macro")


def test_run_succeeds_and_prints_f1_and_the_covid_prediction(trained):
    assert trained.exit_code == 0
    assert "validation: accuracy" in trained.stdout
    assert "f1_macro" in trained.stdout
    line = next(line for line in trained.stdout.splitlines() if line.startswith(f"prediction: {COVID!r}"))
    assert line.split("-> ")[1].split()[0] in LABELS


def test_metrics_json_has_every_field(trained):
    metrics = trained.metrics
    assert metrics["train_runtime"] > 0
    assert metrics["train_samples_per_second"] > 0
    for split in ("validation", "test"):
        for name in SCORES:
            assert 0.0 <= metrics[split][name] <= 1.0, (split, name)
    assert metrics["best_validation_recall_macro"] == pytest.approx(max_eval_recall(trained.output_dir))
    settings = metrics["settings"]
    assert settings["model_name_or_path"] == "tiny"
    assert settings["learning_rate"] == 2e-3
    assert settings["torch_compile"] is False
    assert settings["bf16"] is True  # requested; "effective" says what the CPU got
    assert metrics["effective"]["device"] == "cpu"
    assert metrics["effective"]["world_size"] == 1
    assert metrics["effective"]["torch_compile"] is False
    assert metrics["examples"] == {"train": 266, "validation": 57, "test": 57}
    versions = metrics["versions"]
    for name in ("torch", "transformers", "datasets", "accelerate", "tokenizers"):
        assert versions[name] == metadata.version(name)
    assert versions["python"].count(".") == 2


def max_eval_recall(output_dir):
    """The best per-epoch validation macro recall, read from the last checkpoint's log history."""
    states = sorted((output_dir / "checkpoints").glob("checkpoint-*/trainer_state.json"))
    history = json.loads(states[-1].read_text())["log_history"]
    return max(entry["eval_recall_macro"] for entry in history if "eval_recall_macro" in entry)


def test_output_holds_the_model_and_keeps_two_checkpoints(trained):
    names = {path.name for path in trained.output_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "metrics.json"} <= names
    assert "training_args.bin" not in names
    assert len(list((trained.output_dir / "checkpoints").glob("checkpoint-*"))) <= 2


def test_saved_model_reloads_and_classifies(trained):
    from transformers import AutoModelForSequenceClassification

    from training.predict import classify

    model = AutoModelForSequenceClassification.from_pretrained(trained.output_dir)
    assert model.config.id2label == dict(enumerate(LABELS))
    assert model.config.label2id == {name: index for index, name in enumerate(LABELS)}
    rows = [json.loads(line) for line in (SAMPLE / "train.jsonl").read_text().splitlines()]
    predictions = classify(trained.output_dir, [row["text"] for row in rows])
    assert all(label in LABELS and 0.0 < score <= 1.0 for label, score in predictions)
    correct = sum(label == LABELS[row["label"]] for (label, _), row in zip(predictions, rows, strict=True))
    assert correct / len(rows) > 0.6, "the tiny model should fit most of its own training sentences"


def test_predict_cli(trained, capsys):
    from training import predict

    assert predict.main(["--model-dir", str(trained.output_dir), "I love this", "The bus leaves at noon."]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(line.split("\t")[0] in LABELS for line in lines)


def test_resume_from_last_checkpoint_continues(tmp_path):
    from training import train_sentiment

    output = tmp_path / "model"
    assert train_sentiment.main(sample_args(output, "--no-bf16", "--max-steps", "4", "--save-strategy", "epoch")) == 0
    first = json.loads((output / "metrics.json").read_text())
    assert first["global_steps"] == 4
    resumed = sample_args(output, "--no-bf16", "--max-steps", "6", "--resume-from-checkpoint", "last",
                          "--save-strategy", "epoch")
    assert train_sentiment.main(resumed) == 0
    second = json.loads((output / "metrics.json").read_text())
    assert second["global_steps"] == 6
    # A resumed run carries the first run's history on; a fresh start would have lost the step-4 entry.
    state = json.loads((output / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    evaluated_at = [entry["step"] for entry in state["log_history"] if "eval_recall_macro" in entry]
    assert evaluated_at == [4, 6]


def test_refuses_several_gpus_without_torchrun(monkeypatch, capsys, tmp_path):
    import torch

    from training import train_sentiment

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert train_sentiment.main(sample_args(tmp_path / "model")) == 2
    error = capsys.readouterr().err.strip()
    assert "8 GPUs" in error and "torchrun --nproc_per_node=gpu" in error
    assert not (tmp_path / "model").exists()


def test_help_lists_the_speed_up_switches(capsys):
    from training import train_sentiment

    with pytest.raises(SystemExit) as exit_info:
        train_sentiment.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--no-torch-compile", "--no-bf16", "--no-fused-adamw", "--tf32", "--resume-from-checkpoint"):
        assert flag in text
    # argparse wraps help at hyphens too, so the default is looked for with the wrapping taken out.
    assert "cardiffnlp/twitter-roberta-base-sep2022" in "".join(text.split())


def test_defaults_reproduce_the_recipe():
    from training import train_sentiment

    args = train_sentiment.build_parser().parse_args([])
    assert args.model_name_or_path == "cardiffnlp/twitter-roberta-base-sep2022"
    assert (args.dataset_name, args.dataset_config) == ("cardiffnlp/tweet_eval", "sentiment")
    assert args.num_train_epochs == 10
    assert args.learning_rate == 1e-5
    assert args.per_device_train_batch_size == args.per_device_eval_batch_size == 16
    assert args.torch_compile and args.bf16 and args.fused_adamw
    assert train_sentiment.BEST_METRIC == "recall_macro"


def test_max_samples_take_the_same_seeded_slice_of_each_split():
    from training.train_sentiment import limit_splits

    splits = {name: {"text": [f"{name} {i}" for i in range(50)], "label": [i % 3 for i in range(50)]}
              for name in ("train", "validation", "test")}
    limited = limit_splits(splits, max_train=10, max_eval=5, seed=42)
    assert [len(limited[n]["text"]) for n in ("train", "validation", "test")] == [10, 5, 5]
    assert limited == limit_splits(splits, max_train=10, max_eval=5, seed=42)
    assert limited["train"] != limit_splits(splits, max_train=10, max_eval=5, seed=7)["train"]
    for name in limited:
        for text, label in zip(limited[name]["text"], limited[name]["label"], strict=True):
            assert splits[name]["label"][splits[name]["text"].index(text)] == label
    assert limit_splits(splits, None, None, 42) == splits


def test_pretrained_checkpoint_stored_in_bf16_loads_as_float32(tmp_path):
    """transformers 5 loads a checkpoint's own dtype by default; bf16 mixed precision needs float32 weights."""
    import argparse

    import torch

    from training import tiny
    from training.train_sentiment import _load_model

    texts = [json.loads(line)["text"] for line in (SAMPLE / "train.jsonl").read_text().splitlines()]
    tokenizer = tiny.build_tokenizer(texts, model_max_length=32)
    tiny.build_model(tokenizer, max_length=32).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    args = argparse.Namespace(model_name_or_path=str(tmp_path / "bf16"), cache_dir=None, max_length=32, seed=0)
    _, model = _load_model(args, texts)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}


@pytest.mark.parametrize(("labels", "predicted", "expected"), [
    # Per class (hits, true, predicted): 0 (1, 2, 2), 1 (2, 2, 3), 2 (1, 2, 1); worked out by hand.
    ([0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0], {"accuracy": 4 / 6, "recall_macro": (1 / 2 + 1 + 1 / 2) / 3,
                                              "f1_macro": (2 / 4 + 4 / 5 + 2 / 3) / 3}),
    # Classes with no true and no predicted rows count as 0 in the macro average (scikit-learn's zero_division=0).
    ([0, 0], [0, 1], {"accuracy": 1 / 2, "recall_macro": (1 / 2) / 3, "f1_macro": (2 / 3) / 3}),
])
def test_metrics_are_accuracy_and_macro_recall_and_f1_over_the_three_classes(labels, predicted, expected):
    import numpy as np

    from training.train_sentiment import compute_metrics

    logits = np.eye(len(LABELS))[predicted]  # one-hot: argmax is the prediction
    prediction = type("EvalPrediction", (), {"predictions": (logits,), "label_ids": np.array(labels)})
    assert compute_metrics(prediction) == pytest.approx(expected)
