#!/usr/bin/env bash
# One training run on a GPU instance from the Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023),
# as EC2 user data.
#
# The CDK training stack prepends `export NAME=value` lines for the settings below and runs this script
# once at first boot. It logs in to the Deep Learning Containers registry, builds the training image from
# the code asset on AWS's Amazon Linux 2023 PyTorch image, trains with torchrun on every GPU, packages model.tar.gz, uploads it with metrics and
# logs to s3://$BUCKET/models/sentiment/$RUN_ID/, writes _SUCCESS (or _FAILED naming the failing step,
# after uploading logs and checkpoints), and always ends with a shutdown, which terminates the instance.
set -euo pipefail
#
# Fail safe from the first line: the exit handler and the MAX_HOURS shutdown guard come before anything
# that can fail, and the handler copes with settings that are missing (it writes _FAILED where it can).
STEP="cost guard"
LOG_FILE="${LOG_FILE:-/var/log/training-run.log}"
PREFIX=""
WORK=""
LOG_STREAM=""
if [[ -n "${BUCKET:-}" && -n "${RUN_ID:-}" ]]; then PREFIX="s3://${BUCKET}/models/sentiment/${RUN_ID}"; fi

log() {
  local message
  message="$(date -u +%Y-%m-%dT%H:%M:%SZ) [run ${RUN_ID:-?}] $*"
  echo "$message"
  [[ -n "$LOG_STREAM" ]] || return 0
  # Best effort: a CloudWatch hiccup must not fail the run, the full log also lands in S3.
  aws logs put-log-events --region "${REGION:-}" --log-group-name "${LOG_GROUP:-}" \
    --log-stream-name "$LOG_STREAM" \
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
    if [[ -z "$PREFIX" ]]; then
      log "BUCKET or RUN_ID is missing: no _FAILED marker can be written"
    else
      if [[ -n "$WORK" && -d "${WORK}/checkpoints" ]]; then
        aws s3 cp --only-show-errors --recursive "${WORK}/checkpoints" "${PREFIX}/checkpoints/"
      fi
      if [[ -n "$WORK" && -f "${WORK}/model/metrics.json" ]]; then
        aws s3 cp --only-show-errors "${WORK}/model/metrics.json" "${PREFIX}/metrics.json"
      fi
      if [[ -f "$LOG_FILE" ]]; then
        aws s3 cp --only-show-errors "$LOG_FILE" "${PREFIX}/training.log"
      fi
      printf 'step=%s\nexit_status=%s\ntime=%s\n' "$STEP" "$status" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        | aws s3 cp --only-show-errors - "${PREFIX}/_FAILED"
    fi
  fi
  log "shutting down (instance-initiated shutdown terminates this instance)"
  shutdown -h now
  exit "$status"
}
trap finish EXIT

# Whatever happens below, the instance stops paying after MAX_HOURS (one hour if the setting is unusable).
GUARD_MINUTES=60
if [[ "${MAX_HOURS:-}" =~ ^[1-9][0-9]*$ ]]; then GUARD_MINUTES=$((MAX_HOURS * 60)); fi
shutdown -h "+${GUARD_MINUTES}"

step "check settings"
: "${RUN_ID:?}" "${BUCKET:?}" "${REGION:?}" "${DLC_REGISTRY:?}" "${BASE_IMAGE:?}" "${LOG_GROUP:?}"
: "${TRAINING_CODE_URL:?}" "${INFERENCE_CODE_URL:?}" "${MAX_HOURS:?}" "${TRAIN_ARGS:?}" "${SERVE_ON:?}"
IMAGE="sentiment-training:${RUN_ID}"

step "log set-up"
mkdir -p "$(dirname "$LOG_FILE")"
exec > >(tee -a "$LOG_FILE") 2>&1
# PutLogEvents needs the stream to exist; docker's awslogs driver creates its own streams.
aws logs create-log-stream --region "$REGION" --log-group-name "$LOG_GROUP" --log-stream-name "${RUN_ID}/steps" \
  >/dev/null 2>&1 || true
LOG_STREAM="${RUN_ID}/steps"
log "step: $STEP"

step "local storage"
# Instance types with instance storage (p4d: 8 TB NVMe) get NVME_MOUNT from the stack: data, caches and
# checkpoints go there. The DLAMI mounts it from a boot service that may still be running, so wait for it,
# but not for ever: on such a type the root volume is too small to fall back to.
if [[ -n "${NVME_MOUNT:-}" ]]; then
  deadline=$((SECONDS + ${NVME_WAIT_SECONDS:-300}))
  until mountpoint -q "$NVME_MOUNT"; do
    if ((SECONDS >= deadline)); then
      log "instance storage ${NVME_MOUNT} not mounted after ${NVME_WAIT_SECONDS:-300} s"
      exit 1
    fi
    sleep 5
  done
  WORK_ROOT="$NVME_MOUNT"
fi
WORK="${WORK_ROOT:-/opt/training}/run-${RUN_ID}"
mkdir -p "$WORK"
log "working in ${WORK}"

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
# Amazon Linux 2023 installs packages with dnf (no apt-get); the DLAMI normally has unzip already.
command -v unzip >/dev/null || dnf install -y -q unzip
unzip -q -o "${WORK}/training.zip" -d "${WORK}/code/training"
unzip -q -o "${WORK}/inference.zip" -d "${WORK}/code/inference"

step "build image"
docker build --build-arg "BASE_IMAGE=${BASE_IMAGE}" -t "$IMAGE" -f "${WORK}/code/training/Dockerfile" "${WORK}/code"

DOCKER_RUN=(docker run --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864
  -v "${WORK}:/opt/ml/work"
  --log-driver awslogs --log-opt "awslogs-region=${REGION}" --log-opt "awslogs-group=${LOG_GROUP}")
# EFA (p4d has four): when the instance has EFA devices, hand them to the container and point libfabric at them;
# the image's aws-ofi-nccl plugin (NCCL_NET_PLUGIN=ofi in training/Dockerfile) then carries NCCL's traffic. An
# instance without EFA interfaces has none, and NCCL uses NVLink/NVSwitch inside the one instance.
EFA_DEVICE_DIR="${EFA_DEVICE_DIR:-/dev/infiniband}"
EFA_DEVICES=("$EFA_DEVICE_DIR"/uverbs*)
if [[ -e "${EFA_DEVICES[0]}" ]]; then
  for device in "${EFA_DEVICES[@]}"; do DOCKER_RUN+=(--device "$device"); done
  DOCKER_RUN+=(-e FI_PROVIDER=efa -e FI_EFA_USE_DEVICE_RDMA=1)
  log "EFA devices: ${EFA_DEVICES[*]}"
fi

step "train"
# The image's ENTRYPOINT (/usr/local/bin/entrypoint.sh) ends with `exec "$@"`: the command after the image name goes
# to it as separate arguments, one word each, never as one string.
# shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags rendered by the stack
"${DOCKER_RUN[@]}" --log-opt "awslogs-stream=${RUN_ID}/train" "$IMAGE" \
  torchrun --nproc_per_node "$GPUS" -m training.train_sentiment \
  --output-dir /opt/ml/work/model --checkpoint-dir /opt/ml/work/checkpoints $TRAIN_ARGS

step "package"
# Our serving image carries the handler and every dependency: the archive is the model, the gate's record and
# its ONNX graphs (int8 weights for the endpoint's CPU, SERVE_ON), nothing to install at start-up.
"${DOCKER_RUN[@]}" --log-opt "awslogs-stream=${RUN_ID}/package" "$IMAGE" \
  python -m training.package --model-dir /opt/ml/work/model --output /opt/ml/work/model.tar.gz --serve-on "$SERVE_ON"

step "upload"
aws s3 cp --only-show-errors "${WORK}/model.tar.gz" "${PREFIX}/model.tar.gz"
aws s3 cp --only-show-errors "${WORK}/model/metrics.json" "${PREFIX}/metrics.json"
