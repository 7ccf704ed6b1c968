"""Run the training user data under bash with docker, aws, shutdown and nvidia-smi replaced by recording stubs.

`docker run` does what the Amazon Linux 2023 PyTorch image does with the command after the image name (aws/
deep-learning-containers e0ecedea, docker/pytorch/Dockerfile.cuda target `runtime`: ENTRYPOINT
["/usr/local/bin/entrypoint.sh"]; scripts/docker/pytorch/entrypoint.sh: a CUDA compat check, then `exec "$@"`, no
`eval`): it execs the arguments as given, with the image's PATH (/opt/venv/bin first) and WORKDIR. The programs
inside (torchrun, python, pip) are stubs that record their argument vector one word per field, so a command passed as
one string fails as it would in the image ("no such file").
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from settings import REPO_ROOT
from tests.conftest import prerequisite

SCRIPT = REPO_ROOT / "training" / "ec2" / "run_training.sh"

# Each stub appends its name and arguments to $CALLS, one line per call, and fakes just enough output.
# A stub whose call line contains $FAIL_ON exits with status 3: that is how a test breaks one step.
FAIL_ON = 'if [[ -n "${FAIL_ON:-}" && "$(basename "$0") $*" == *"$FAIL_ON"* ]]; then echo "injected" >&2; exit 3; fi\n'
STUBS = {
    "mountpoint": 'echo "mountpoint $*" >> "$CALLS"',
    "nvidia-smi": 'echo "nvidia-smi $*" >> "$CALLS"\n'
                  'for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA A100-SXM4-40GB"; done',
    "shutdown": 'echo "shutdown $*" >> "$CALLS"',
    "docker": r'''echo "docker $*" >> "$CALLS"
[[ "$1" == "run" ]] || { [[ "$1" == "login" ]] && cat > /dev/null; exit 0; }
shift
work=""
while [[ $# -gt 0 && "$1" != sentiment-training:* ]]; do
  if [[ "$1" == "-v" ]]; then work="${2%%:*}"; fi
  if [[ "$1" == "--device" ]]; then echo "device $2" >> "$CALLS"; fi
  if [[ "$1" == "-e" ]]; then echo "container-env $2" >> "$CALLS"; fi
  if [[ "$1" =~ ^(-v|--device|-e|--log-driver|--log-opt|--ulimit|--gpus)$ ]]; then shift; fi
  shift
done
shift  # the image; what follows goes to its ENTRYPOINT as separate arguments
export WORK_HOST="$work"
cd "$IMAGE_ROOT/workspace"
PATH="$IMAGE_ROOT/opt/venv/bin:$PATH" exec "$IMAGE_ROOT/usr/local/bin/entrypoint.sh" "$@"''',
    "aws": r'''echo "aws $*" >> "$CALLS"
case "$1 $2" in
  "ecr get-login-password") echo "secret-token" ;;
  "s3 cp")
    args=()
    for arg in "${@:3}"; do [[ "$arg" == --* ]] || args+=("$arg"); done
    src="${args[0]}"; dst="${args[1]}"
    if [[ "$src" == "-" ]]; then cat > "$UPLOADS/$(basename "$dst")";
    elif [[ "$src" == s3://* ]]; then (cd "$FIXTURE" && zip -q -r "$dst" .);
    fi ;;
esac''',
}

# The image's ENTRYPOINT after its CUDA compat check (no compat libraries here): exec its arguments as given.
IMAGE_ENTRYPOINT = 'exec "$@"'
# Programs on the image's PATH (/opt/venv/bin); each records "container <name>|<arg>|<arg>..." and fakes its output
# under the host folder mounted at /opt/ml/work.
CONTAINER_STUBS = {
    "torchrun": r'''work="$WORK_HOST"
mkdir -p "$work/checkpoints/checkpoint-1" "$work/model"
echo '{"partial": true}' > "$work/checkpoints/checkpoint-1/trainer_state.json"
if [[ "${FAIL_STEP:-}" == "train" ]]; then echo "CUDA out of memory" >&2; exit 3; fi
echo '{"validation": {"f1_macro": 0.7}}' > "$work/model/metrics.json"''',
    "python": r'''if [[ "$*" == *training.package* ]]; then echo "archive" > "$WORK_HOST/model.tar.gz"; fi''',
    "pip": "true",
}

VALUES = {
    "RUN_ID": "run-0042",
    "BUCKET": "artifact-bucket",
    "REGION": "us-west-2",
    "DLC_REGISTRY": "763104351884.dkr.ecr.us-west-2.amazonaws.com",
    "BASE_IMAGE": "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch:2.13.0-cu133-amzn2023",
    "LOG_GROUP": "training-logs",
    "TRAINING_CODE_URL": "s3://cdk-assets/training.zip",
    "INFERENCE_CODE_URL": "s3://cdk-assets/inference.zip",
    "MAX_HOURS": "6",
    "TRAIN_ARGS": "--num-train-epochs 10 --learning-rate 1e-05",
    "SERVE_ON": "ml.c7g.4xlarge",
}

PREFIX = "s3://artifact-bucket/models/sentiment/run-0042"


def run_user_data(tmp_path: Path, fail_step: str | None = None, fail_on: str | None = None,
                  **overrides: str | None) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    bin_dir, uploads, fixture = tmp_path / "bin", tmp_path / "uploads", tmp_path / "fixture"
    for folder in (bin_dir, uploads, fixture):
        folder.mkdir()
    (fixture / "Dockerfile").write_text("FROM scratch\n")
    for name, body in STUBS.items():
        stub = bin_dir / name
        stub.write_text(f"#!/usr/bin/env bash\nset -eu\n{FAIL_ON}{body}\n")
        stub.chmod(0o755)
    image = tmp_path / "image"
    for folder in ("opt/venv/bin", "usr/local/bin", "workspace"):
        (image / folder).mkdir(parents=True)
    entrypoint = image / "usr/local/bin/entrypoint.sh"
    entrypoint.write_text(f"#!/bin/bash\nset -e\n{IMAGE_ENTRYPOINT}\n")
    entrypoint.chmod(0o755)
    for name, body in CONTAINER_STUBS.items():
        stub = image / "opt/venv/bin" / name
        record = 'line="container $(basename "$0")"; for arg in "$@"; do line+="|$arg"; done; echo "$line" >> "$CALLS"'
        stub.write_text(f"#!/usr/bin/env bash\nset -eu\n{record}\n{FAIL_ON}{body}\n")
        stub.chmod(0o755)
    calls = tmp_path / "calls.log"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls), "UPLOADS": str(uploads), "FIXTURE": str(fixture), "IMAGE_ROOT": str(image),
        "EFA_DEVICE_DIR": str(tmp_path / "no-efa"),
        "NVME_MOUNT": str(tmp_path / "nvme"), "NVME_WAIT_SECONDS": "0",
        "LOG_FILE": str(tmp_path / "log" / "training-run.log"),
        **VALUES,
    }
    if fail_step:
        env["FAIL_STEP"] = fail_step
    if fail_on:
        env["FAIL_ON"] = fail_on
    for name, value in overrides.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    return result, calls.read_text().splitlines(), uploads


def _index(calls: list[str], fragment: str) -> int:
    matches = [i for i, call in enumerate(calls) if fragment in call]
    assert matches, f"no call contains {fragment!r}:\n" + "\n".join(calls)
    return matches[0]


pytestmark = prerequisite(shutil.which("zip") is not None and shutil.which("unzip") is not None,
                          "the stubs build the code archive with zip and unzip (`make test` installs them)")


def test_successful_run_trains_packages_uploads_marks_and_shuts_down(tmp_path):
    result, calls, uploads = run_user_data(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    order = [
        _index(calls, 'shutdown -h +360'),
        _index(calls, "docker login --username AWS --password-stdin 763104351884.dkr.ecr.us-west-2.amazonaws.com"),
        _index(calls, "docker pull 763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch:2.13.0-cu133-amzn2023"),
        _index(calls, "docker build --build-arg BASE_IMAGE="),
        _index(calls, "torchrun --nproc_per_node 8 -m training.train_sentiment"),
        _index(calls, "python -m training.package --model-dir /opt/ml/work/model --output /opt/ml/work/model.tar.gz"),
        _index(calls, f"model.tar.gz {PREFIX}/model.tar.gz"),
        _index(calls, f"metrics.json {PREFIX}/metrics.json"),
        _index(calls, f"training-run.log {PREFIX}/training.log"),
        _index(calls, f"aws s3 cp --only-show-errors - {PREFIX}/_SUCCESS"),
        _index(calls, "shutdown -h now"),
    ]
    assert order == sorted(order), "\n".join(calls)
    # Piped into docker login; the two run at once, so only its presence is checked.
    assert _index(calls, "aws ecr get-login-password --region us-west-2") >= 0
    train = calls[_index(calls, "torchrun")]
    for flag in ("--gpus all", "--ipc=host", "--ulimit memlock=-1", "--ulimit stack=67108864",
                 "--num-train-epochs 10 --learning-rate 1e-05", "--checkpoint-dir /opt/ml/work/checkpoints"):
        assert flag in train
    assert "run run-0042 succeeded" in (uploads / "_SUCCESS").read_text()
    assert not (uploads / "_FAILED").exists()
    assert not any("/checkpoints/" in c and c.startswith("aws s3 cp") for c in calls)
    assert calls[-1] == "shutdown -h now"


def test_failed_training_step_keeps_logs_and_checkpoints_writes_failed_and_shuts_down(tmp_path):
    result, calls, uploads = run_user_data(tmp_path, fail_step="train")
    assert result.returncode == 3
    assert not any("training.package" in c for c in calls), "must stop at the failing step"
    assert not (uploads / "_SUCCESS").exists()
    order = [
        _index(calls, "torchrun"),
        _index(calls, f"--recursive {tmp_path}/nvme/run-run-0042/checkpoints {PREFIX}/checkpoints/"),
        _index(calls, f"training-run.log {PREFIX}/training.log"),
        _index(calls, f"- {PREFIX}/_FAILED"),
        _index(calls, "shutdown -h now"),
    ]
    assert order == sorted(order), "\n".join(calls)
    failed = (uploads / "_FAILED").read_text()
    assert "step=train\n" in failed and "exit_status=3\n" in failed
    log = (tmp_path / "log" / "training-run.log").read_text()
    assert "run failed in step 'train'" in log and "CUDA out of memory" in log
    assert calls[-1] == "shutdown -h now"


def test_every_step_is_logged_to_cloudwatch(tmp_path):
    _, calls, _ = run_user_data(tmp_path)
    steps = [c for c in calls if c.startswith("aws logs put-log-events") and "step: " in c]
    assert [s.split("step: ")[1].split('"')[0] for s in steps] == [
        "log set-up", "local storage", "gpu check", "registry login", "pull base image", "fetch code", "build image",
        "train", "package", "upload"]
    assert all("--log-group-name training-logs --log-stream-name run-0042/steps" in s for s in steps)
    # The stream exists before the first event is put.
    create = _index(calls, "aws logs create-log-stream --region us-west-2 --log-group-name training-logs "
                           "--log-stream-name run-0042/steps")
    assert create < _index(calls, "aws logs put-log-events")


# step -> how to break it: a stub call to fail (FAIL_ON), or a changed environment.
FAILURES = {
    "cost guard": {"fail_on": "shutdown -h +"},
    "check settings": {"TRAIN_ARGS": None},
    "log set-up": {"LOG_FILE": "/dev/null/training-run.log"},
    "local storage": {"fail_on": "mountpoint -q"},
    "gpu check": {"fail_on": "nvidia-smi -L"},
    "registry login": {"fail_on": "docker login"},
    "pull base image": {"fail_on": "docker pull"},
    "fetch code": {"fail_on": "cp --only-show-errors s3://cdk-assets/training.zip"},
    "build image": {"fail_on": "docker build"},
    "train": {"fail_on": "torchrun"},
    "package": {"fail_on": "training.package"},
    "upload": {"fail_on": f"model.tar.gz {PREFIX}/model.tar.gz"},
}


def test_failures_cover_every_step_of_the_script():
    steps = ["cost guard"] + [line.split('"')[1] for line in SCRIPT.read_text().splitlines()
                              if line.startswith('step "')]
    assert steps == list(FAILURES)


@pytest.mark.parametrize("step", list(FAILURES))
def test_a_failure_at_any_step_marks_the_step_failed_and_shuts_down(tmp_path, step):
    result, calls, uploads = run_user_data(tmp_path, **FAILURES[step])
    assert result.returncode != 0, result.stdout + result.stderr
    failed = (uploads / "_FAILED").read_text()
    assert f"step={step}\n" in failed, failed + result.stdout + result.stderr
    assert not (uploads / "_SUCCESS").exists()
    assert calls[-1] == "shutdown -h now", "\n".join(calls)
    if step != "cost guard":
        # The MAX_HOURS guard was scheduled before the failing step ran.
        assert calls[0] == "shutdown -h +360", "\n".join(calls)
    assert f"run failed in step '{step}'" in result.stdout


def test_storage_wait_uses_the_nvme_on_instance_storage_types(tmp_path):
    result, calls, _ = run_user_data(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"mountpoint -q {tmp_path}/nvme" in calls
    assert f"working in {tmp_path}/nvme/run-run-0042" in result.stdout


def test_without_instance_storage_the_root_volume_is_used_and_nothing_waits(tmp_path):
    result, calls, _ = run_user_data(tmp_path, NVME_MOUNT=None, WORK_ROOT=str(tmp_path / "root"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert not any(c.startswith("mountpoint") for c in calls)
    assert (tmp_path / "root" / "run-run-0042" / "model.tar.gz").is_file()


def test_missing_bucket_still_shuts_down(tmp_path):
    result, calls, uploads = run_user_data(tmp_path, BUCKET=None)
    assert result.returncode != 0
    assert not any(uploads.iterdir())
    assert calls[0] == "shutdown -h +360" and calls[-1] == "shutdown -h now"
    assert "no _FAILED marker can be written" in result.stdout


def test_the_image_entrypoint_gets_the_commands_as_argument_lists(tmp_path):
    """Each command reaches the image's `exec "$@"` one word per argument (a single string would not run)."""
    result, calls, _ = run_user_data(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    train = calls[_index(calls, "container torchrun|")].split("|")
    assert train[:6] == ["container torchrun", "--nproc_per_node", "8", "-m", "training.train_sentiment",
                         "--output-dir"]
    assert "--num-train-epochs" in train and train[train.index("--num-train-epochs") + 1] == "10"
    package = calls[_index(calls, "container python|")].split("|")
    assert package[1:4] == ["-m", "training.package", "--model-dir"]
    assert "--wheelhouse" not in package  # our image carries the handler's packages (issue 43)
    # The int8 graph gets the weights the endpoint's CPU needs (issue 44): one argument after the flag.
    assert package[package.index("--serve-on") + 1] == "ml.c7g.4xlarge"


def test_efa_devices_go_to_the_container_when_the_instance_has_them(tmp_path):
    devices = tmp_path / "infiniband"
    devices.mkdir()
    for index in range(4):  # p4d.24xlarge: four EFA devices
        (devices / f"uverbs{index}").touch()
    result, calls, _ = run_user_data(tmp_path, EFA_DEVICE_DIR=str(devices))
    assert result.returncode == 0, result.stdout + result.stderr
    train_devices = [c for c in calls if c.startswith("device ")]
    # two docker runs (train, package), four devices each
    assert train_devices[:4] == [f"device {devices}/uverbs{index}" for index in range(4)]
    assert "container-env FI_PROVIDER=efa" in calls and "container-env FI_EFA_USE_DEVICE_RDMA=1" in calls
    (tmp_path / "plain").mkdir()
    without, plain_calls, _ = run_user_data(tmp_path / "plain")
    assert without.returncode == 0
    assert not any(c.startswith(("device ", "container-env FI_")) for c in plain_calls)


def test_a_command_given_as_one_string_does_not_run_in_the_image(tmp_path):
    """The stub image is strict the way the real one is: `exec "$@"` of one string looks for a program of that name."""
    run_user_data(tmp_path)
    entrypoint = tmp_path / "image/usr/local/bin/entrypoint.sh"
    joined = subprocess.run([str(entrypoint), "torchrun --nproc_per_node 8"], capture_output=True, text=True,
                            env={"PATH": f"{tmp_path}/image/opt/venv/bin:/usr/bin:/bin", "CALLS": str(tmp_path / "x")})
    assert joined.returncode == 127 and "torchrun --nproc_per_node 8" in joined.stderr
