"""Registers a finished training run as a SageMaker model package, or rejects it and says why.

Triggered through EventBridge when `models/sentiment/<run_id>/_SUCCESS` lands in the artifact bucket. A run
is registered only if its model.tar.gz is a non-empty gzip archive and its metrics.json holds the validation
metrics; otherwise nothing is registered and the reason is logged and published to the alarm topic.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import ClientError

logger = Logger(service="register-model")
metrics = Metrics(namespace=os.environ.get("METRICS_NAMESPACE", "MlRecipes"), service="register-model")

MARKER = re.compile(r"^(?P<prefix>models/sentiment/(?P<run_id>[a-z0-9][a-z0-9-]{0,47}))/_SUCCESS$")
REQUIRED_METRICS = ("accuracy", "recall_macro", "f1_macro")
GZIP_MAGIC = b"\x1f\x8b"


class RejectedRun(Exception):
    """The run is not fit to register; the message says why."""


@dataclass(frozen=True)
class Run:
    bucket: str
    run_id: str
    prefix: str

    @property
    def model_key(self) -> str:
        return f"{self.prefix}/model.tar.gz"

    @property
    def metrics_key(self) -> str:
        return f"{self.prefix}/metrics.json"

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


def parse_event(event: dict) -> Run:
    """The run named by an EventBridge 'Object Created' event for a _SUCCESS marker."""
    try:
        bucket = event["detail"]["bucket"]["name"]
        key = event["detail"]["object"]["key"]
    except (KeyError, TypeError) as error:
        raise RejectedRun(f"not an S3 Object Created event: missing {error}") from None
    match = MARKER.match(key)
    if not match:
        raise RejectedRun(f"s3://{bucket}/{key} is not a models/sentiment/<run_id>/_SUCCESS marker")
    return Run(bucket=bucket, run_id=match["run_id"], prefix=match["prefix"])


def check_model(s3, run: Run) -> int:
    """Size of model.tar.gz, after checking it exists, is not empty and starts like a gzip file."""
    try:
        head = s3.head_object(Bucket=run.bucket, Key=run.model_key)
    except ClientError as error:
        raise RejectedRun(f"{run.uri(run.model_key)} is missing ({error.response['Error'].get('Code')})") from None
    size = head["ContentLength"]
    if size == 0:
        raise RejectedRun(f"{run.uri(run.model_key)} is empty")
    start = s3.get_object(Bucket=run.bucket, Key=run.model_key, Range="bytes=0-1")["Body"].read()
    if start[:2] != GZIP_MAGIC:
        raise RejectedRun(f"{run.uri(run.model_key)} is not a gzip archive")
    return size


def read_metrics(s3, run: Run) -> dict:
    """The validation (and, when present, test) metrics, each checked to be a number from 0 to 1."""
    try:
        body = s3.get_object(Bucket=run.bucket, Key=run.metrics_key)["Body"].read()
    except ClientError as error:
        raise RejectedRun(f"{run.uri(run.metrics_key)} is missing ({error.response['Error'].get('Code')})") from None
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RejectedRun(f"{run.uri(run.metrics_key)} is not valid JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("validation"), dict):
        raise RejectedRun(f"{run.uri(run.metrics_key)} has no 'validation' metrics")
    found = {}
    for split in ("validation", "test"):
        values = document.get(split)
        if values is None and split == "test":
            continue
        for name in REQUIRED_METRICS:
            value = values.get(name) if isinstance(values, dict) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise RejectedRun(f"{run.uri(run.metrics_key)}: {split}.{name} is {value!r}, not a number from 0 to 1")
            found[f"{split}_{name}"] = float(value)
    minimum = float(os.environ.get("MIN_VALIDATION_F1", "0"))
    if found["validation_f1_macro"] < minimum:
        raise RejectedRun(f"validation f1_macro {found['validation_f1_macro']:.3f} is below the minimum {minimum:.3f}")
    return found


def register(sagemaker, run: Run, scores: dict) -> str:
    response = sagemaker.create_model_package(
        ModelPackageGroupName=os.environ["MODEL_PACKAGE_GROUP"],
        ModelPackageDescription=f"Sentiment run {run.run_id}",
        ModelApprovalStatus="PendingManualApproval",
        InferenceSpecification={
            "Containers": [{"Image": os.environ["INFERENCE_IMAGE"], "ModelDataUrl": run.uri(run.model_key)}],
            "SupportedContentTypes": ["application/json"],
            "SupportedResponseMIMETypes": ["application/json"],
            "SupportedRealtimeInferenceInstanceTypes": [os.environ["INFERENCE_INSTANCE_TYPE"]],
        },
        ModelMetrics={"ModelQuality": {"Statistics": {
            "ContentType": "application/json", "S3Uri": run.uri(run.metrics_key)}}},
        CustomerMetadataProperties={"run_id": run.run_id, **{k: f"{v:.4f}" for k, v in scores.items()}},
    )
    return response["ModelPackageArn"]


def notify(sns, subject: str, message: str) -> None:
    topic = os.environ.get("TOPIC_ARN")
    if topic:
        sns.publish(TopicArn=topic, Subject=subject[:100], Message=message)


@logger.inject_lambda_context(log_event=True)
@metrics.log_metrics
def handler(event: dict, context: object) -> dict:
    s3, sagemaker, sns = boto3.client("s3"), boto3.client("sagemaker"), boto3.client("sns")
    try:
        run = parse_event(event)
        logger.append_keys(run_id=run.run_id)
        size = check_model(s3, run)
        scores = read_metrics(s3, run)
    except RejectedRun as rejection:
        reason = str(rejection)
        logger.warning("run rejected", reason=reason)
        metrics.add_metric(name="RunsRejected", unit=MetricUnit.Count, value=1)
        notify(sns, "Training run rejected", reason)
        return {"registered": False, "reason": reason}
    arn = register(sagemaker, run, scores)
    logger.info("run registered", model_package_arn=arn, model_bytes=size, **scores)
    metrics.add_metric(name="RunsRegistered", unit=MetricUnit.Count, value=1)
    return {"registered": True, "model_package_arn": arn, "run_id": run.run_id, **scores}
