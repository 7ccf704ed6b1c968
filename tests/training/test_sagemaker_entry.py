"""The SageMaker entry point as two "instances" on this machine: torchrun --nnodes 2 on gloo, SageMaker's layout.

Each node gets its own folders shaped like an instance's /opt/ml (channels, model, checkpoints, output) and
the variables SageMaker's layout gives it (hosts, current host, channels, model dir); the two torchrun
launches meet on 127.0.0.1. The resume test restores node 0's checkpoints to both nodes, as SageMaker does
from the CheckpointConfig's S3 prefix after a spot interruption.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.training.conftest import SAMPLE
from training import sagemaker_entry
from training.sagemaker_entry import Cluster, SetupError

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["algo-1", "algo-2"]
TRAIN_ARGS = ["--model-name-or-path", "tiny", "--max-length", "32", "--learning-rate", "2e-3",
              "--no-torch-compile", "--no-bf16", "--save-total-limit", "3"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _node(root: Path, host: str) -> Path:
    """An instance's /opt/ml: one channel folder per split holding that split's file."""
    for channel in ("train", "validation", "test"):
        (root / "input" / "data" / channel).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SAMPLE / f"{channel}.jsonl", root / "input" / "data" / channel / f"{channel}.jsonl")
    for folder in ("model", "checkpoints", "output"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    return root


def _env(root: Path, host: str, port: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    env.update({
        "SM_HOSTS": json.dumps(HOSTS), "SM_CURRENT_HOST": host, "SM_NUM_GPUS": "0",
        "SM_MODEL_DIR": str(root / "model"), "SM_OUTPUT_DIR": str(root / "output"),
        **{f"SM_CHANNEL_{c.upper()}": str(root / "input" / "data" / c) for c in ("train", "validation", "test")},
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
        # The pipeline sets the endpoint's instance type (stacks/sagemaker_training.py); an x86 one without VNNI
        # here, so the record shows the variable, not the default, made the int8 graph.
        sagemaker_entry.SERVE_ON_ENV: "ml.c5.xlarge",
    })  # fmt: skip
    return env


def _run_two_nodes(roots: list[Path], *train_args: str, gate: bool = True) -> list[subprocess.CompletedProcess]:
    port = _free_port()
    gate_args = ["--gate-rounds", "1"] if gate else ["--skip-gate"]
    launches = [
        subprocess.Popen(
            [sys.executable, "-m", "training.sagemaker_entry", "--checkpoint-dir", str(root / "checkpoints"),
             *gate_args, "--", *TRAIN_ARGS, *train_args],
            cwd=ROOT, env=_env(root, host, port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)  # its own process group: torchrun and its workers go with it
        for root, host in zip(roots, HOSTS, strict=True)
    ]
    done = []
    for launch in launches:
        try:
            out, _ = launch.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for other in launches:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(other.pid, signal.SIGKILL)
            # Where each node stopped: the last lines of both, not only the first node's opening ones.
            tails = [f"--- {host}:\n" + "\n".join((other.communicate(timeout=30)[0] or "").splitlines()[-25:])
                     for other, host in zip(launches, HOSTS, strict=True)]
            raise AssertionError("two-node run did not finish in 240 s\n" + "\n".join(tails)) from None
        done.append(subprocess.CompletedProcess(launch.args, launch.returncode, out, ""))
    return done


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    base = tmp_path_factory.mktemp("sagemaker")
    roots = [_node(base / host, host) for host in HOSTS]
    return roots, _run_two_nodes(roots, "--max-steps", "4", "--num-train-epochs", "4")


def test_two_nodes_train_one_model_on_node_zero(two_nodes):
    roots, runs = two_nodes
    for run in runs:
        assert run.returncode == 0, run.stdout[-4000:]
    node0, node1 = roots
    metrics = json.loads((node0 / "model" / "metrics.json").read_text())
    assert metrics["effective"]["world_size"] == 2
    assert metrics["global_steps"] == 4
    assert metrics["examples"] == {"train": 266, "validation": 57, "test": 57}
    # Only global rank 0 writes: the second instance's model dir stays empty (SageMaker uploads node 0's).
    assert list((node1 / "model").iterdir()) == []
    assert "node 1 of 2 (algo-2)" in runs[1].stdout
    # The registry reads metrics.json from the checkpoint prefix.
    assert json.loads((node0 / "checkpoints" / "metrics.json").read_text()) == metrics


def test_model_dir_is_what_the_endpoint_hosts(two_nodes, tmp_path):
    from training import package

    model_dir = two_nodes[0][0] / "model"
    names = {p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names
    assert not any(name.startswith("checkpoint") for name in names)
    assert not any(name.startswith("code/") for name in names)  # our image carries the handler (issue 43)
    # The same precision record as training.package writes (issue 32): accuracy apart from speed, and the CPU.
    from inference.sentiment import precision
    from inference.sentiment.cpu_features import this_cpu

    record = precision.read_record(model_dir)
    here = {name for name in precision.PRECISIONS if not precision.cpu_reason(name, this_cpu())}
    assert set(record["figures"]) == here and "fp32" in record["accuracy"]["passed"]
    assert set(record["speed"]["ms_per_batch"]) <= set(precision.PRECISIONS) and record["gate"]["rounds"] == 1
    # ... and the same ONNX graphs beside it (issue 35), which the gate measured
    assert {"onnx/model.fp32.onnx", "onnx/model.int8.onnx", "onnx/export.json"} <= names
    assert json.loads((model_dir / package.CALIBRATION_TEXTS).read_text()) == package.held_out_texts()
    assert record["figures"]["onnx-fp32"]["passed"] and record["gate"]["onnx_export"]["graphs"]
    made = record["gate"]["onnx_export"]["int8"]
    assert (made["target"], made["weight_bits"]) == ("ml.c5.xlarge", 7)  # issue 44: the endpoint's CPU decides
    assert record["speed"]["measured_on"]["bf16_instructions"] in (True, False)
    # SageMaker tars /opt/ml/model as is; the packaging checks accept that archive.
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(model_dir.rglob("*")):
            tar.add(path, arcname=path.relative_to(model_dir).as_posix(), recursive=False)
    assert "config.json" in package.verify_archive(archive)


def test_resume_after_interruption_continues_from_the_restored_checkpoint(two_nodes, tmp_path):
    roots, runs = two_nodes
    assert all(run.returncode == 0 for run in runs)
    # A replacement cluster: fresh instances, the checkpoint prefix restored into each one's /opt/ml/checkpoints.
    fresh = [_node(tmp_path / host, host) for host in HOSTS]
    for root in fresh:
        shutil.rmtree(root / "checkpoints")
        shutil.copytree(roots[0] / "checkpoints", root / "checkpoints")
    # The gate ran after the first run (test_model_dir_is_what_the_endpoint_hosts); here only the resume is checked.
    resumed = _run_two_nodes(fresh, "--max-steps", "6", "--num-train-epochs", "4", gate=False)
    for run in resumed:
        assert run.returncode == 0, run.stdout[-4000:]
        assert "--resume-from-checkpoint last" in run.stdout
    metrics = json.loads((fresh[0] / "model" / "metrics.json").read_text())
    assert metrics["global_steps"] == 6
    state = json.loads((fresh[0] / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    evaluated_at = [entry["step"] for entry in state["log_history"] if "eval_recall_macro" in entry]
    assert evaluated_at[:1] == [4] and evaluated_at[-1] == 6  # history carried over, not a fresh start


# --- the layout readers, without training ------------------------------------------------------------

def test_cluster_from_variables_orders_hosts_and_finds_the_rank():
    cluster = sagemaker_entry.read_cluster(
        {"SM_HOSTS": '["algo-2", "algo-1"]', "SM_CURRENT_HOST": "algo-2", "SM_NUM_GPUS": "8"})
    assert cluster == Cluster(("algo-1", "algo-2"), "algo-2", "algo-1", 29500, 8)
    assert cluster.node_rank == 1 and not cluster.is_main_node


def test_cluster_from_resourceconfig_turns_on_efa_like_sagemakers_driver(tmp_path):
    config = tmp_path / "resourceconfig.json"
    config.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1", "algo-2", "algo-3"],
                                  "current_instance_type": "ml.p4d.24xlarge", "network_interface_name": "eth0"}))
    cluster = sagemaker_entry.read_cluster({"SM_NUM_GPUS": "8"}, resource_config=config)
    assert (cluster.node_rank, len(cluster.hosts), cluster.master_addr) == (0, 3, "algo-1")
    assert cluster.launch_environment() == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1",
                                            "NCCL_SOCKET_IFNAME": "eth0"}
    g5 = Cluster(("algo-1",), "algo-1", "algo-1", 29500, 1, "ml.g5.2xlarge", "eth0")
    assert g5.launch_environment() == {"NCCL_SOCKET_IFNAME": "eth0"}


@pytest.mark.parametrize(("environ", "message"), [
    ({}, "not inside a SageMaker training job"),
    ({"SM_HOSTS": "algo-1", "SM_CURRENT_HOST": "algo-1"}, "not a JSON list"),
    ({"SM_HOSTS": "[]", "SM_CURRENT_HOST": "algo-1"}, "non-empty list"),
    ({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-9"}, "'algo-9' is not among the hosts"),
])
def test_cluster_errors_say_what_is_wrong(environ, message, tmp_path):
    with pytest.raises(SetupError, match=message):
        sagemaker_entry.read_cluster({**environ, "SM_NUM_GPUS": "1"}, resource_config=tmp_path / "none.json")


def test_command_adds_channels_and_resume_and_spans_all_gpus(tmp_path):
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "part.jsonl").write_text("{}\n")
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "checkpoint-3").mkdir(parents=True)
    (checkpoints / "checkpoint-3" / "trainer_state.json").write_text("{}")
    cluster = Cluster(("algo-1", "algo-2"), "algo-2", "algo-1", 29500, 8)
    command = sagemaker_entry.torchrun_command(cluster, ["--max-steps", "9"], model_dir=tmp_path / "model",
                                               checkpoint_dir=checkpoints, environ={}, input_data=data)
    text = " ".join(command)
    assert "--nnodes 2 --node_rank 1 --nproc_per_node 8 --master_addr algo-1 --master_port 29500" in text
    assert f"--train-file {data / 'train' / 'part.jsonl'}" in text
    assert "--validation-file" not in text  # no such channel: the trainer falls back to the hub data set
    assert "--resume-from-checkpoint last" in text and "--max-steps 9" in text
    assert text.endswith("--save-strategy epoch")  # resumable after a spot interruption: a checkpoint per epoch


def test_an_ambiguous_channel_is_refused(tmp_path):
    (tmp_path / "train").mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / "train" / name).write_text("{}\n")
    with pytest.raises(SetupError, match="exactly one"):
        sagemaker_entry.channel_file("train", {}, input_data=tmp_path)


def test_setup_error_lands_in_the_failure_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SM_HOSTS", '["algo-1"]')
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-7")
    monkeypatch.setenv("SM_NUM_GPUS", "0")
    assert sagemaker_entry.main(["--output-dir", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c")]) == 2
    assert "algo-7" in (tmp_path / "failure").read_text()


def test_a_wrong_serve_on_is_refused_before_training_with_the_reason_in_the_failure_file(tmp_path, monkeypatch):
    """SERVE_ON decides the int8 graph's weights at the export after training: named at start, not hours later."""
    monkeypatch.setenv(sagemaker_entry.SERVE_ON_ENV, "c7g.large")
    assert sagemaker_entry.main(["--output-dir", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c")]) == 2
    assert "--serve-on 'c7g.large': not a SageMaker instance type" in (tmp_path / "failure").read_text()
    assert not (tmp_path / "c").exists()  # nothing started
