"""One tiny training run per session, shared by the tests that read its outputs.

It is the `make train-local` path on an even smaller setting: the shipped sample, the tiny model,
no torch.compile (its first CPU compile takes a minute), a few epochs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SAMPLE = Path(__file__).resolve().parents[2] / "training" / "data" / "sample"
COVID = "Covid cases are increasing fast!"


def sample_args(output_dir: Path, *extra: str) -> list[str]:
    """Arguments for a tiny CPU run on the shipped sample."""
    return [
        "--model-name-or-path", "tiny",
        "--train-file", str(SAMPLE / "train.jsonl"),
        "--validation-file", str(SAMPLE / "validation.jsonl"),
        "--test-file", str(SAMPLE / "test.jsonl"),
        "--output-dir", str(output_dir),
        "--max-length", "32",
        "--num-train-epochs", "4",
        "--learning-rate", "2e-3",
        "--no-torch-compile",
        *extra,
    ]  # fmt: skip


@dataclass
class Run:
    output_dir: Path
    exit_code: int
    stdout: str
    metrics: dict


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Run:
    """Run training.train_sentiment in-process once and keep what it printed and wrote."""
    import contextlib
    import io

    from training import train_sentiment

    output_dir = tmp_path_factory.mktemp("tiny-run") / "model"
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        exit_code = train_sentiment.main(sample_args(output_dir, "--predict", COVID, "--predict", "I love it"))
    metrics_file = output_dir / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
    return Run(output_dir, exit_code, captured.getvalue(), metrics)
