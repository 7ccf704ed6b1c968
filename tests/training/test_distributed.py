"""Two DDP processes (torchrun, gloo on the CPU) must report what one process reports on the same data.

transformers 5.20's Trainer multiplied a sequence classifier's loss by the number of processes (see
training.hardware.batch_mean_loss): two processes logged 2.2 where one logged ln 3 = 1.10. The learning
rate is tiny so both runs evaluate the same, untrained model and every metric must agree. Both runs are compiled as
the p4d's processes are (Dynamo, full graph, static shapes), so DDP and the compiled step are checked together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.training.conftest import SAMPLE

pytestmark = pytest.mark.slow


def _args(output_dir, per_device_batch: int) -> list[str]:
    return [
        "--model-name-or-path", "tiny",
        "--train-file", str(SAMPLE / "train.jsonl"),
        "--validation-file", str(SAMPLE / "validation.jsonl"),
        "--output-dir", str(output_dir),
        "--max-length", "32",
        "--max-steps", "2",
        "--learning-rate", "1e-9",
        "--per-device-train-batch-size", str(per_device_batch),
        # Compiled as the p4d's 8 processes compile (full graph, static shapes), with Dynamo's eager backend: Dynamo
        # splits the DDP-wrapped graph at its gradient buckets (DDPOptimizer). CUDA graphs do not apply on a CPU; with
        # DDP on several GPUs they are a documented risk (pytorch#128218) that only a multi-GPU run can show.
        "--torch-compile", "--torch-compile-backend", "eager", "--no-bf16",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from training import train_sentiment

    root = tmp_path_factory.mktemp("ddp")
    single = root / "single"
    assert train_sentiment.main(_args(single, per_device_batch=16)) == 0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    double = root / "double"
    # Same global batch (2 x 8 = 16) as the single run.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "training.train_sentiment", *_args(double, per_device_batch=8)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return (json.loads((single / "metrics.json").read_text()), json.loads((double / "metrics.json").read_text()),
            result)


def test_two_processes_report_the_losses_and_metrics_of_one(runs):
    single, double, _ = runs
    assert (single["effective"]["world_size"], double["effective"]["world_size"]) == (1, 2)
    # Both compiled, DDP's wrapper included: Dynamo made graphs in the two-process run and recompiled nothing.
    assert double["effective"]["torch_compile"] and double["compile"]["unique_graphs"] >= 1
    assert double["compile"]["recompiles"] == 0, double["compile"]["recompile_reasons"]
    assert single["effective"]["global_train_batch_size"] == double["effective"]["global_train_batch_size"] == 16
    # An untrained 3-class classifier's cross-entropy is ln 3; the bug doubled it.
    assert single["train_loss"] == pytest.approx(1.0986, abs=0.02)
    assert double["train_loss"] == pytest.approx(single["train_loss"], abs=0.02)
    assert double["validation"].keys() == single["validation"].keys()
    # Predictions are gathered from both ranks: the scores are the same; the loss is a mean of per-batch means,
    # whose batches differ in size between the runs, so it agrees to a few 1e-4.
    assert double["validation"]["loss"] == pytest.approx(single["validation"]["loss"], abs=2e-3)
    for name in ("accuracy", "recall_macro", "f1_macro"):
        assert double["validation"][name] == pytest.approx(single["validation"][name], abs=1e-9), name
    assert double["examples"] == single["examples"]


def test_only_rank_zero_writes_and_reports(runs):
    _, double, result = runs
    assert double["global_steps"] == 2
    # Each process runs main(); only the main process prints the summary and writes metrics.json.
    assert result.stdout.count("validation: accuracy") == 1
    assert result.stdout.count("model and metrics.json in") == 1
