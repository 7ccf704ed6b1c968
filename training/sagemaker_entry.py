"""The SageMaker training job's program: torchrun across every GPU of every instance, then a hostable model dir.

SageMaker starts this once per instance (the pipeline's ContainerEntrypoint unpacks the code channels, installs
training/requirements.txt and runs `python -m training.sagemaker_entry -- <trainer flags>`).
It reads the cluster from SageMaker's layout:

- hosts and this host: `SM_HOSTS` (a JSON list) and `SM_CURRENT_HOST`, else the platform's
  `/opt/ml/input/config/resourceconfig.json` (`hosts`, `current_host`); node rank = position in the sorted hosts;
- data: `SM_CHANNEL_TRAIN`, `SM_CHANNEL_VALIDATION`, `SM_CHANNEL_TEST` (else `/opt/ml/input/data/<channel>`);
  without a train channel the trainer downloads its hub data set;
- `SM_MODEL_DIR` (`/opt/ml/model`, which SageMaker tars into model.tar.gz), `/opt/ml/checkpoints` (synced
  with S3 by the CheckpointConfig; restored there after a spot interruption, so the run resumes from the
  newest checkpoint-*), `SM_OUTPUT_DIR` (`/opt/ml/output`, whose `failure` file becomes the job's
  FailureReason).

After training, node 0 turns the model dir into what the sentiment endpoint loads directly: weights and
tokenizer at the root, `precision.json` (the accuracy gate's record, as `training.package` writes it, run on this
instance's CPU: which precisions pass holds anywhere, the timings only for this kind of CPU) and `onnx/` (the
model exported to ONNX before the gate, as `training.package` does); no `code/`, since our serving image carries
the handler and its packages. It also copies metrics.json next to the checkpoints, where the model registry reads
it (the archive itself is not readable by S3 URI).

Exit status: 0 done; 2 a wrong environment or argument (no hosts, unknown host, ambiguous channel);
otherwise torchrun's status, or 3 when the finished model cannot be made hostable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from inference.sentiment.int8_target import DEFAULT_TARGET as DEFAULT_SERVE_ON
from inference.sentiment.int8_target import resolve as resolve_int8_target

PROG = "python -m training.sagemaker_entry"
# The endpoint's instance type, set by the pipeline (stacks/sagemaker_training.py): its CPU decides the int8 weights.
SERVE_ON_ENV = "SERVE_ON"
ROOT = Path(__file__).resolve().parent.parent
RESOURCE_CONFIG = Path("/opt/ml/input/config/resourceconfig.json")
INPUT_DATA = Path("/opt/ml/input/data")
CHANNELS = {"train": "--train-file", "validation": "--validation-file", "test": "--test-file"}
DATA_SUFFIXES = (".jsonl", ".json", ".csv")
DEFAULT_PORT = 29500
# Where SageMaker syncs the CheckpointConfig's S3 prefix (fixed by the pipeline's CheckpointConfig.LocalPath).
DEFAULT_CHECKPOINTS = "/opt/ml/checkpoints"
METRICS_FILE = "metrics.json"


# Instance types whose EFA the training toolkit's torchrun driver turns on (FI_PROVIDER=efa), and those that also
# get RDMA (FI_EFA_USE_DEVICE_RDMA=1): aws/sagemaker-training-toolkit src/sagemaker_training/__init__.py
# SM_EFA_NCCL_INSTANCES / SM_EFA_RDMA_INSTANCES, applied in torch_distributed.py. This job runs its own
# entrypoint, so it sets them the same way.
EFA_INSTANCES = ("ml.g4dn.8xlarge", "ml.g4dn.12xlarge", "ml.g5.48xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge",
                 "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.trn1.32xlarge")
EFA_RDMA_INSTANCES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.trn1.32xlarge")


class SetupError(ValueError):
    """The environment or the arguments cannot start a run; one line for the job's FailureReason."""


@dataclass(frozen=True)
class Cluster:
    hosts: tuple[str, ...]
    current_host: str
    master_addr: str
    master_port: int
    gpus_per_host: int
    instance_type: str = ""
    network_interface: str = ""

    @property
    def node_rank(self) -> int:
        return self.hosts.index(self.current_host)

    @property
    def is_main_node(self) -> bool:
        return self.node_rank == 0

    def launch_environment(self) -> dict[str, str]:
        """NCCL and EFA variables for torchrun's processes, as SageMaker's own torchrun driver sets them."""
        env = {}
        if self.instance_type in EFA_INSTANCES:
            env["FI_PROVIDER"] = "efa"
        if self.instance_type in EFA_RDMA_INSTANCES:
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
        if self.network_interface:
            env["NCCL_SOCKET_IFNAME"] = self.network_interface
        return env


def read_cluster(environ: dict[str, str] | None = None, resource_config: Path = RESOURCE_CONFIG) -> Cluster:
    """The hosts of the job and this host's place among them, from SM_* variables or resourceconfig.json."""
    env = os.environ if environ is None else environ
    if "SM_HOSTS" in env:
        try:
            hosts = json.loads(env["SM_HOSTS"])
        except ValueError as error:
            raise SetupError(f"SM_HOSTS={env['SM_HOSTS']!r} is not a JSON list of host names") from error
        current = env.get("SM_CURRENT_HOST", "")
        instance_type, interface = env.get("SM_CURRENT_INSTANCE_TYPE", ""), env.get("SM_NETWORK_INTERFACE_NAME", "")
    elif resource_config.is_file():
        config = json.loads(resource_config.read_text())
        hosts, current = config.get("hosts", []), config.get("current_host", "")
        instance_type, interface = config.get("current_instance_type", ""), config.get("network_interface_name", "")
    else:
        raise SetupError(f"no SM_HOSTS and no {resource_config}: not inside a SageMaker training job")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise SetupError(f"hosts must be a non-empty list of names, got {hosts!r}")
    hosts = tuple(sorted(hosts))  # SageMaker names them algo-1..algo-N; every node must agree on the order
    if current not in hosts:
        raise SetupError(f"current host {current!r} is not among the hosts {list(hosts)}")
    return Cluster(
        hosts=hosts,
        current_host=current,
        # Instances reach each other by host name inside the job; tests on one machine set MASTER_ADDR.
        master_addr=env.get("MASTER_ADDR", hosts[0]),
        master_port=int(env.get("MASTER_PORT", DEFAULT_PORT)),
        gpus_per_host=_gpus(env),
        instance_type=instance_type,
        network_interface=interface,
    )


def _gpus(env) -> int:
    if env.get("SM_NUM_GPUS"):
        return int(env["SM_NUM_GPUS"])
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def channel_file(name: str, environ: dict[str, str] | None = None, input_data: Path = INPUT_DATA) -> Path | None:
    """The one data file of channel `name`, or None when the job has no such channel."""
    env = os.environ if environ is None else environ
    folder = Path(env[f"SM_CHANNEL_{name.upper()}"]) if f"SM_CHANNEL_{name.upper()}" in env else input_data / name
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)
    if len(files) != 1:
        raise SetupError(f"channel {name} ({folder}) must hold exactly one {'/'.join(DATA_SUFFIXES)} file, "
                         f"found {[p.name for p in files]}")
    return files[0]


def has_checkpoint(checkpoint_dir: Path) -> bool:
    """A complete Trainer checkpoint is there (SageMaker restored it after an interruption)."""
    return any((path / "trainer_state.json").is_file() for path in checkpoint_dir.glob("checkpoint-*"))


def torchrun_command(cluster: Cluster, train_args: list[str], *, model_dir: Path, checkpoint_dir: Path,
                     environ: dict[str, str] | None = None, input_data: Path = INPUT_DATA) -> list[str]:
    """torchrun for this node: one process per GPU (one on a CPU-only host), static rendezvous on host 0."""
    args = list(train_args)
    for channel, flag in CHANNELS.items():
        found = None if flag in args else channel_file(channel, environ, input_data)
        if found is not None:
            args += [flag, str(found)]
    if "--resume-from-checkpoint" not in args and has_checkpoint(checkpoint_dir):
        args += ["--resume-from-checkpoint", "last"]
    if "--save-strategy" not in args:
        # A spot interruption or a retried execution resumes from the newest checkpoint (synced to S3): one per
        # epoch loses at most an epoch, where "best" (train_sentiment's default) could lose several.
        args += ["--save-strategy", "epoch"]
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(len(cluster.hosts)),
        "--node_rank", str(cluster.node_rank),
        "--nproc_per_node", str(max(cluster.gpus_per_host, 1)),
        "--master_addr", cluster.master_addr,
        "--master_port", str(cluster.master_port),
        "-m", "training.train_sentiment",
        "--output-dir", str(model_dir),
        "--checkpoint-dir", str(checkpoint_dir),
        *args,
    ]  # fmt: skip


def make_hostable(model_dir: Path, *, gate: bool = True, gate_rounds: int | None = None,
                  serve_on: str = DEFAULT_SERVE_ON) -> None:
    """Add the accuracy gate's precision.json and the ONNX graphs (int8 weights for `serve_on`, the endpoint's
    instance type) to the finished model dir, so SageMaker's model.tar.gz is what the endpoint loads and carries the
    same record as an archive from `training.package`."""
    from training import package

    package.check_model_dir(model_dir)
    record = None
    shutil.rmtree(model_dir / package.ONNX_DIR, ignore_errors=True)  # made afresh, like the record
    if gate:
        say = lambda line: print(line, flush=True)  # noqa: E731
        package.export_onnx(model_dir, model_dir / package.ONNX_DIR, say, serve_on)
        record = package.precision_record(model_dir, gate_rounds, say, model_dir / package.ONNX_DIR)
    for name in (*package.SKIPPED_FILES, package.PRECISION_RECORD):
        (model_dir / name).unlink(missing_ok=True)
    if record is not None:
        (model_dir / package.PRECISION_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    texts = model_dir / package.CALIBRATION_TEXTS  # for the accuracy check on the serving CPU
    texts.parent.mkdir(exist_ok=True)
    texts.write_text(json.dumps(package.held_out_texts(), ensure_ascii=False) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run training.train_sentiment on every GPU of every instance of a SageMaker training job "
        "and leave a model dir the sentiment endpoint hosts as is. Trainer flags follow '--'.",
        epilog="Exit status: 0 done, 2 wrong environment or arguments, 3 model not hostable, else torchrun's.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model-dir", type=Path, default=Path(os.environ.get("SM_MODEL_DIR", "/opt/ml/model")))
    parser.add_argument("--checkpoint-dir", type=Path, default=Path(DEFAULT_CHECKPOINTS),
                        help="synced with S3 by SageMaker; resumes from its newest checkpoint-*")
    parser.add_argument("--output-dir", type=Path, default=Path(os.environ.get("SM_OUTPUT_DIR", "/opt/ml/output")),
                        help="its 'failure' file becomes the job's FailureReason")
    parser.add_argument("--skip-gate", action="store_true",
                        help="no gate and no ONNX graphs (the endpoint then chooses among torch's pairs at start); "
                             "the accuracy gate runs on this instance's CPU after training")
    parser.add_argument("--gate-rounds", type=int, help="timed rounds per precision in the gate (default: the gate's)")
    parser.add_argument("--serve-on", default=os.environ.get(SERVE_ON_ENV, DEFAULT_SERVE_ON), metavar="INSTANCE_TYPE",
                        help=f"the endpoint's instance type, whose CPU decides the int8 graph's weights (default: "
                             f"${SERVE_ON_ENV}, which the pipeline sets to sentiment.instance_type)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then training.train_sentiment flags")
    return parser


def _fail(output_dir: Path, message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "failure").write_text(message[:1000] + "\n")
    except OSError:
        pass
    return status


def main(argv: list[str] | None = None) -> int:
    from training import package

    args = build_parser().parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    for reserved in ("--output-dir", "--checkpoint-dir"):
        if reserved in train_args:
            return _fail(args.output_dir, f"{reserved} is set by {PROG}; use its own option instead", 2)
    if not args.skip_gate:  # a wrong target is named now, not after hours of training at the export
        try:
            resolve_int8_target(args.serve_on)
        except ValueError as error:
            return _fail(args.output_dir, str(error), 2)
    try:
        cluster = read_cluster()
        command = torchrun_command(cluster, train_args, model_dir=args.model_dir, checkpoint_dir=args.checkpoint_dir)
    except SetupError as error:
        return _fail(args.output_dir, str(error), 2)
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    print(f"node {cluster.node_rank} of {len(cluster.hosts)} ({cluster.current_host}): {' '.join(command)}",
          flush=True)
    status = subprocess.run(command, cwd=ROOT, env={**os.environ, **cluster.launch_environment()},
                            check=False).returncode
    if status != 0:
        return _fail(args.output_dir, f"torchrun on {cluster.current_host} exited with status {status}; "
                     "the lines above say why", status)
    if not cluster.is_main_node:
        return 0  # only global rank 0 (on node 0) writes the model
    try:
        make_hostable(args.model_dir, gate=not args.skip_gate, gate_rounds=args.gate_rounds, serve_on=args.serve_on)
    except package.PackageError as error:
        return _fail(args.output_dir, f"the trained model is not hostable: {error}", 3)
    metrics = args.model_dir / METRICS_FILE
    if metrics.is_file():
        shutil.copyfile(metrics, args.checkpoint_dir / METRICS_FILE)
    print(f"model dir {args.model_dir} is hostable as SageMaker's model.tar.gz", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
