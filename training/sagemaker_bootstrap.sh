#!/usr/bin/env bash
# Start of the SageMaker training job on every instance, run from /opt/ml/code by the pipeline's
# ContainerEntrypoint once it has unpacked the `code` channel (training/) into ./training.
# Unpacks the `handler` channel (inference/, for the accuracy gate and the ONNX export), installs the pinned
# Hugging Face stack on top of the PyTorch training DLC, then hands over to training.sagemaker_entry; the arguments
# are training.sagemaker_entry's trainer flags.
set -euo pipefail

python -m zipfile -e /opt/ml/input/data/handler/*.zip inference
python -m pip install --quiet --no-cache-dir --root-user-action=ignore -r training/requirements.txt
exec python -m training.sagemaker_entry -- "$@"
