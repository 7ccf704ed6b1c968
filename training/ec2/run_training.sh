#!/usr/bin/env bash
# One training run on a GPU instance from the Deep Learning AMI, as EC2 user data.
#
# The CDK training stack prepends `export NAME=value` lines for the settings below and runs this script
# once at first boot. It logs in to the Deep Learning Containers registry, builds the training image from
# the code asset, trains with torchrun on every GPU, packages model.tar.gz, uploads it with metrics and
# logs to s3://$BUCKET/models/sentiment/$RUN_ID/, writes _SUCCESS (or _FAILED naming the failing step,
# after uploading logs and checkpoints), and always ends with a shutdown, which terminates the instance.
set -euo pipefail

: "${RUN_ID:?}" "${BUCKET:?}" "${REGION:?}" "${DLC_REGISTRY:?}" "${BASE_IMAGE:?}" "${LOG_GROUP:?}"
: "${TRAINING_CODE_URL:?}" "${INFERENCE_CODE_URL:?}" "${MAX_HOURS:?}" "${TRAIN_ARGS:?}"
PREFIX="s3://${BUCKET}/models/sentiment/${RUN_ID}"
LOG_FILE="${LOG_FILE:-/var/log/training-run.log}"
# The instance's NVMe (p4d: 8 TB) holds data, caches and checkpoints; the root volume is the fallback.
if [[ -z "${WORK_ROOT:-}" ]]; then
  WORK_ROOT=/opt/training
  if [[ -d /opt/dlami/nvme ]]; then
    # The DLAMI mounts the NVMe from a boot service that may still be running: wait for it (5 min at most).
    for _ in $(seq 60); do
      if mountpoint -q /opt/dlami/nvme; then WORK_ROOT=/opt/dlami/nvme; break; fi
      sleep 5
    done
  fi
fi
WORK="${WORK_ROOT}/run-${RUN_ID}"
IMAGE="sentiment-training:${RUN_ID}"
STEP="start"

mkdir -p "$WORK" "$(dirname "$LOG_FILE")"
exec > >(tee -a "$LOG_FILE") 2>&1
# PutLogEvents needs the stream to exist; docker's awslogs driver creates its own streams.
aws logs create-log-stream --region "$REGION" --log-group-name "$LOG_GROUP" --log-stream-name "${RUN_ID}/steps" \
  >/dev/null 2>&1 || true

log() {
  local message
  message="$(date -u +%Y-%m-%dT%H:%M:%SZ) [run ${RUN_ID}] $*"
  echo "$message"
  # Best effort: a CloudWatch hiccup must not fail the run, the full log also lands in S3.
  aws logs put-log-events --region "$REGION" --log-group-name "$LOG_GROUP" --log-stream-name "${RUN_ID}/steps" \
    --log-events "timestamp=$(date +%s%3N),message=\"${message//\"/\'}\"" >/dev/null 2>&1 || true
}

step() {
  STEP="$1"
  log "step: $STEP"
}

finish() {
  local status=$?
  trap - EXIT
  set +e
  if [[ $status -eq 0 ]]; then
    log "run succeeded"
    aws s3 cp --only-show-errors "$LOG_FILE" "${PREFIX}/training.log"
    echo "run ${RUN_ID} succeeded at $(date -u +%Y-%m-%dT%H:%M:%SZ)" | aws s3 cp --only-show-errors - "${PREFIX}/_SUCCESS"
  else
    log "run failed in step '${STEP}' (exit status ${status}); uploading logs and checkpoints"
    if [[ -d "${WORK}/checkpoints" ]]; then
      aws s3 cp --only-show-errors --recursive "${WORK}/checkpoints" "${PREFIX}/checkpoints/"
    fi
    if [[ -f "${WORK}/model/metrics.json" ]]; then
      aws s3 cp --only-show-errors "${WORK}/model/metrics.json" "${PREFIX}/metrics.json"
    fi
    aws s3 cp --only-show-errors "$LOG_FILE" "${PREFIX}/training.log"
    printf 'step=%s\nexit_status=%s\ntime=%s\n' "$STEP" "$status" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
      | aws s3 cp --only-show-errors - "${PREFIX}/_FAILED"
  fi
  log "shutting down (instance-initiated shutdown terminates this instance)"
  shutdown -h now
  exit "$status"
}
trap finish EXIT

step "cost guard"
# Whatever happens below, the instance stops paying after MAX_HOURS.
shutdown -h "+$((MAX_HOURS * 60))"

step "gpu check"
nvidia-smi -L
GPUS="$(nvidia-smi -L | grep -c '^GPU ')"
log "found ${GPUS} GPUs"

step "registry login"
aws ecr get-login-password --region "$REGION" | docker login --username AWS --password-stdin "$DLC_REGISTRY"

step "pull base image"
docker pull "$BASE_IMAGE"

step "fetch code"
mkdir -p "${WORK}/code"
aws s3 cp --only-show-errors "$TRAINING_CODE_URL" "${WORK}/training.zip"
aws s3 cp --only-show-errors "$INFERENCE_CODE_URL" "${WORK}/inference.zip"
unzip -q -o "${WORK}/training.zip" -d "${WORK}/code/training"
unzip -q -o "${WORK}/inference.zip" -d "${WORK}/code/inference"

step "build image"
docker build --build-arg "BASE_IMAGE=${BASE_IMAGE}" -t "$IMAGE" -f "${WORK}/code/training/Dockerfile" "${WORK}/code"

DOCKER_RUN=(docker run --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864
  -v "${WORK}:/opt/ml/work"
  --log-driver awslogs --log-opt "awslogs-region=${REGION}" --log-opt "awslogs-group=${LOG_GROUP}")

step "train"
# shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags rendered by the stack
"${DOCKER_RUN[@]}" --log-opt "awslogs-stream=${RUN_ID}/train" "$IMAGE" \
  torchrun --nproc_per_node "$GPUS" -m training.train_sentiment \
  --output-dir /opt/ml/work/model --checkpoint-dir /opt/ml/work/checkpoints $TRAIN_ARGS

step "wheelhouse"
# The endpoint runs with network isolation, so the handler's wheels (linux aarch64) travel in the archive.
"${DOCKER_RUN[@]}" --log-opt "awslogs-stream=${RUN_ID}/package" "$IMAGE" \
  pip download --quiet --only-binary=:all: --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
  --python-version "${SERVING_PYTHON:-3.12}" -d /opt/ml/work/wheels -r inference/requirements.txt

step "package"
"${DOCKER_RUN[@]}" --log-opt "awslogs-stream=${RUN_ID}/package" "$IMAGE" \
  python -m training.package --model-dir /opt/ml/work/model --output /opt/ml/work/model.tar.gz \
  --wheelhouse /opt/ml/work/wheels

step "upload"
aws s3 cp --only-show-errors "${WORK}/model.tar.gz" "${PREFIX}/model.tar.gz"
aws s3 cp --only-show-errors "${WORK}/model/metrics.json" "${PREFIX}/metrics.json"
