"""The SageMaker Pipeline definition for the sentiment fine-tune: train -> quality gate -> register (or fail).

Plain functions from settings and resource references to the definition's JSON, so the tests can map every
step's `Arguments` onto the SageMaker API request it becomes and validate it against botocore's service
model. The definition format (`Version` 2020-12-01; steps `Training`, `Condition`, `RegisterModel`, `Fail`;
`{"Get": ...}` property references; `Std:Join`) is what the SageMaker Python SDK writes
(`sagemaker/workflow/{steps,condition_step,fail_step,properties,functions}.py`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from settings.training import TrainingSettings
from stacks.instances import has_instance_storage

DEFINITION_VERSION = "2020-12-01"
# AWS's Amazon Linux 2023 PyTorch training images; the tag is the one sagemaker-core's image_uris.retrieve(
# framework="pytorch-amzn2023", image_scope="training") names (settings.training.SAGEMAKER_IMAGE_TAGS).
TRAINING_REPOSITORY = "pytorch"
# Pipeline runs write here; the EC2 runs' models/sentiment/ prefix (and its _SUCCESS trigger) stays theirs.
RUN_PREFIX = "models/sentiment-sagemaker"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
TRAIN_STEP, GATE_STEP, REGISTER_STEP, FAIL_STEP = "Train", "QualityGate", "Register", "BelowQualityBar"
# Metric names the job parses from the trainer's log (train_sentiment prints "validation: accuracy 0.712 ...").
GATE_METRIC = "validation:recall_macro"
METRIC_DEFINITIONS = [
    {"Name": f"{split}:{name}", "Regex": rf"^{split}: .*\b{name} ([0-9]*\.[0-9]+)"}
    for split in ("validation", "test") for name in ("accuracy", "recall_macro", "f1_macro")
] + [{"Name": "train:loss", "Regex": r"'loss': '?([0-9]*\.[0-9]+)"},
     {"Name": "eval:recall_macro", "Regex": r"'eval_recall_macro': '?([0-9]*\.[0-9]+)"}]
# ContainerEntrypoint: unpack the training code channel, then run the bootstrap it carries (each entrypoint and
# argument item may be at most 256 characters). The arguments after it are train_sentiment's flags. It replaces the
# image's own ENTRYPOINT, so it starts with the image's /usr/local/bin/entrypoint.sh (aws/deep-learning-containers
# e0ecedea scripts/docker/pytorch/entrypoint.sh, in both the EC2 and the SageMaker stage of
# docker/pytorch/Dockerfile.cuda): the CUDA forward-compatibility check, then `exec "$@"` of the rest as given.
# `python` is /opt/venv/bin/python, first on the image's PATH.
IMAGE_ENTRYPOINT = "/usr/local/bin/entrypoint.sh"
ENTRYPOINT = [
    IMAGE_ENTRYPOINT, "/bin/bash", "-c",
    "set -euo pipefail; mkdir -p /opt/ml/code && cd /opt/ml/code && "
    "python -m zipfile -e /opt/ml/input/data/code/*.zip training && "
    "exec bash training/sagemaker_bootstrap.sh \"$@\"",
    "sagemaker_bootstrap",
]
CODE_CHANNEL, HANDLER_CHANNEL = "code", "handler"


@dataclass(frozen=True)
class Resources:
    """What the definition refers to; values may be CDK tokens (rendered by Stack.to_json_string)."""

    bucket_name: str
    key_arn: str
    training_role_arn: str
    security_group_id: str
    subnet_ids: list[str]
    code_url: str  # s3:// URL of the zipped training/ folder
    handler_url: str  # s3:// URL of the zipped inference/ folder
    training_image: str
    inference_image: str
    inference_instance_type: str
    model_package_group: str
    # The sentiment stack's container environment (our server's settings), so the package hosts as is.
    inference_environment: dict[str, str] | None = None


def trainer_arguments(config: TrainingSettings) -> list[str]:
    """The same flags the EC2 path passes (stacks.training.train_args), one list item each."""
    from stacks.training import train_args

    return shlex.split(train_args(config))


def run_uri(resources: Resources, *parts: Any) -> dict:
    """s3://bucket/models/sentiment-sagemaker/<execution id>/<parts>, joined when the pipeline runs."""
    return {"Std:Join": {"On": "", "Values": [
        f"s3://{resources.bucket_name}/{RUN_PREFIX}/", {"Get": "Execution.PipelineExecutionId"}, "/", *parts]}}


def training_request(config: TrainingSettings, resources: Resources) -> dict:
    """CreateTrainingJob's request, less TrainingJobName (the pipeline names each job)."""
    resource_config: dict[str, Any] = {
        "InstanceType": config.sagemaker_instance_type,
        "InstanceCount": config.instance_count,
        "VolumeSizeInGB": config.volume_gib,
    }
    # Local NVMe is encrypted by the instance's hardware, and CreateTrainingJob refuses a VolumeKmsKeyId for it
    # (botocore's ResourceConfig.VolumeKmsKeyId documentation).
    if not has_instance_storage(config.sagemaker_instance_type):
        resource_config["VolumeKmsKeyId"] = resources.key_arn
    stopping: dict[str, int] = {"MaxRuntimeInSeconds": config.max_hours * 3600}
    request: dict[str, Any] = {
        "AlgorithmSpecification": {
            "TrainingImage": resources.training_image,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ENTRYPOINT,
            "ContainerArguments": trainer_arguments(config),
            "MetricDefinitions": METRIC_DEFINITIONS,
            "EnableSageMakerMetricsTimeSeries": True,
        },
        "RoleArn": resources.training_role_arn,
        "InputDataConfig": [
            _code_channel(CODE_CHANNEL, resources.code_url),
            _code_channel(HANDLER_CHANNEL, resources.handler_url),
        ],
        "OutputDataConfig": {"S3OutputPath": f"s3://{resources.bucket_name}/{RUN_PREFIX}/jobs/",
                             "KmsKeyId": resources.key_arn},
        "ResourceConfig": resource_config,
        "VpcConfig": {"SecurityGroupIds": [resources.security_group_id], "Subnets": list(resources.subnet_ids)},
        "StoppingCondition": stopping,
        "EnableNetworkIsolation": False,  # the job downloads the base model, the data set and pip packages
        "EnableInterContainerTrafficEncryption": True,
        # Always synced, so a spot interruption or a retried execution resumes; metrics.json lands here too.
        "CheckpointConfig": {"S3Uri": run_uri(resources, "checkpoints/"), "LocalPath": CHECKPOINT_LOCAL_PATH},
        # Unbuffered, so the metric lines reach the log (and the MetricDefinitions) as they are printed.
        "Environment": {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
                        # NCCL over EFA between instances: the image's aws-ofi-nccl (/opt/amazon/ofi-nccl/lib64,
                        # on its LD_LIBRARY_PATH) with NCCL from the pip wheel. FI_PROVIDER and RDMA are set per
                        # instance type by training.sagemaker_entry, as SageMaker's own torchrun driver does.
                        "NCCL_NET_PLUGIN": "ofi",
                        # The endpoint's instance type: the int8 graph gets the weights its CPU needs.
                        "SERVE_ON": resources.inference_instance_type},
    }
    if config.spot:
        request["EnableManagedSpotTraining"] = True
        stopping["MaxWaitTimeInSeconds"] = config.spot_wait_hours * 3600
    return request


def _code_channel(name: str, url: str) -> dict:
    return {
        "ChannelName": name,
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": url,
                                        "S3DataDistributionType": "FullyReplicated"}},
        "InputMode": "File",
        "ContentType": "application/zip",
    }


def _metric(name: str) -> dict:
    return {"Get": f"Steps.{TRAIN_STEP}.FinalMetricDataList['{name}'].Value"}


def register_request(config: TrainingSettings, resources: Resources) -> dict:
    """CreateModelPackage's request: SageMaker's own model.tar.gz, hostable as is, pending manual approval."""
    return {
        "ModelPackageGroupName": resources.model_package_group,
        "ModelPackageDescription": {"Std:Join": {"On": "", "Values": [
            "Sentiment model of pipeline execution ", {"Get": "Execution.PipelineExecutionId"}]}},
        "ModelApprovalStatus": "PendingManualApproval",
        "InferenceSpecification": {
            "Containers": [{"Image": resources.inference_image,
                            "ModelDataUrl": {"Get": f"Steps.{TRAIN_STEP}.ModelArtifacts.S3ModelArtifacts"},
                            **({"Environment": resources.inference_environment}
                               if resources.inference_environment else {})}],
            "SupportedContentTypes": ["application/json"],
            "SupportedResponseMIMETypes": ["application/json"],
            "SupportedRealtimeInferenceInstanceTypes": [resources.inference_instance_type],
        },
        "ModelMetrics": {"ModelQuality": {"Statistics": {
            "ContentType": "application/json", "S3Uri": run_uri(resources, "checkpoints/metrics.json")}}},
        "CustomerMetadataProperties": {
            "training_job": {"Get": f"Steps.{TRAIN_STEP}.TrainingJobName"},
            "min_macro_recall": f"{config.min_macro_recall:g}",
            **{name.replace(":", "_"): {"Std:Join": {"On": "", "Values": [_metric(name)]}}
               for name in (GATE_METRIC, "validation:f1_macro", "validation:accuracy")},
        },
    }


def pipeline_definition(config: TrainingSettings, resources: Resources) -> dict:
    """The whole definition: Train, then QualityGate -> Register, or -> BelowQualityBar (a Fail step)."""
    register = {"Name": REGISTER_STEP, "Type": "RegisterModel", "Arguments": register_request(config, resources)}
    fail = {"Name": FAIL_STEP, "Type": "Fail", "Arguments": {"ErrorMessage": {"Std:Join": {"On": "", "Values": [
        f"validation macro recall below the minimum {config.min_macro_recall:g}: ", _metric(GATE_METRIC)]}}}}
    return {
        "Version": DEFINITION_VERSION,
        "Metadata": {},
        "Parameters": [],
        # No PipelineExperimentConfig: no experiment or trial records, so the pipeline role needs no rights on them.
        "Steps": [
            {"Name": TRAIN_STEP, "Type": "Training", "Arguments": training_request(config, resources)},
            {"Name": GATE_STEP, "Type": "Condition", "Arguments": {
                "Conditions": [{"Type": "GreaterThanOrEqualTo", "LeftValue": _metric(GATE_METRIC),
                                "RightValue": config.min_macro_recall}],
                "IfSteps": [register],
                "ElseSteps": [fail],
            }},
        ],
    }
