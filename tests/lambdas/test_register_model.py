"""register_model: a good run becomes a pending model package; every bad run is rejected, said and published."""

from __future__ import annotations

import gzip
import json

import boto3
import pytest

from lambdas.register_model import handler as register_model
from tests.lambdas.conftest import REGION, FakeContext

BUCKET = "artifacts"
GROUP = "mlrecipes-dev-sentiment"
GOOD_METRICS = {"validation": {"accuracy": 0.71, "recall_macro": 0.70, "f1_macro": 0.69},
                "test": {"accuracy": 0.70, "recall_macro": 0.69, "f1_macro": 0.68}, "train_runtime": 12.5}


@pytest.fixture
def world(aws, topic, monkeypatch):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    sagemaker.create_model_package_group(ModelPackageGroupName=GROUP)
    monkeypatch.setenv("MODEL_PACKAGE_GROUP", GROUP)
    monkeypatch.setenv("INFERENCE_IMAGE", "123456789012.dkr.ecr.us-west-2.amazonaws.com/"
                                          "cdk-hnb659fds-container-assets-123456789012-us-west-2:x")
    monkeypatch.setenv("INFERENCE_INSTANCE_TYPE", "ml.c7g.4xlarge")
    return s3, sagemaker, topic


def put_run(s3, run_id="run-0007", model: bytes | None = None, metrics: object = GOOD_METRICS) -> str:
    prefix = f"models/sentiment/{run_id}"
    if model is None:
        model = gzip.compress(b"model archive")
    if model is not False:
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/model.tar.gz", Body=model)
    if metrics is not None:
        body = metrics if isinstance(metrics, bytes) else json.dumps(metrics).encode()
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/metrics.json", Body=body)
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/_SUCCESS", Body=b"ok")
    return f"{prefix}/_SUCCESS"


def event(key: str, bucket: str = BUCKET) -> dict:
    return {"source": "aws.s3", "detail-type": "Object Created",
            "detail": {"bucket": {"name": bucket}, "object": {"key": key}}}


def packages(sagemaker) -> list[dict]:
    return sagemaker.list_model_packages(ModelPackageGroupName=GROUP)["ModelPackageSummaryList"]


def test_good_run_is_registered_pending_manual_approval(world):
    s3, sagemaker, published = world
    result = register_model.handler(event(put_run(s3)), FakeContext())
    assert result["registered"] is True and result["run_id"] == "run-0007"
    assert result["validation_f1_macro"] == pytest.approx(0.69)
    [summary] = packages(sagemaker)
    assert summary["ModelApprovalStatus"] == "PendingManualApproval"
    described = sagemaker.describe_model_package(ModelPackageName=summary["ModelPackageArn"])
    container = described["InferenceSpecification"]["Containers"][0]
    assert container["ModelDataUrl"] == f"s3://{BUCKET}/models/sentiment/run-0007/model.tar.gz"
    assert described["ModelMetrics"]["ModelQuality"]["Statistics"]["S3Uri"].endswith("run-0007/metrics.json")
    assert published() == []


BAD_RUNS = [
    ("missing model", {"model": False}, "model.tar.gz is missing"),
    ("empty model", {"model": b""}, "model.tar.gz is empty"),
    ("not gzip", {"model": b"PK\x03\x04zip"}, "is not a gzip archive"),
    ("missing metrics", {"metrics": None}, "metrics.json is missing"),
    ("broken JSON", {"metrics": b"{not json"}, "is not valid JSON"),
    ("no validation", {"metrics": {"test": GOOD_METRICS["test"]}}, "has no 'validation' metrics"),
    ("metric out of range", {"metrics": {"validation": {"accuracy": 1.5, "recall_macro": 0.5, "f1_macro": 0.5}}},
     "validation.accuracy is 1.5"),
    ("metric missing", {"metrics": {"validation": {"accuracy": 0.5, "recall_macro": 0.5}}},
     "validation.f1_macro is None"),
    ("bool metric", {"metrics": {"validation": {"accuracy": True, "recall_macro": 0.5, "f1_macro": 0.5}}},
     "validation.accuracy is True"),
    ("bad test split", {"metrics": {**GOOD_METRICS, "test": {"accuracy": "high"}}}, "test.accuracy is 'high'"),
]


@pytest.mark.parametrize(("name", "run", "reason"), BAD_RUNS, ids=[b[0] for b in BAD_RUNS])
def test_bad_run_is_rejected_reported_and_not_registered(world, name, run, reason):
    s3, sagemaker, published = world
    result = register_model.handler(event(put_run(s3, **run)), FakeContext())
    assert result["registered"] is False
    assert reason in result["reason"]
    assert packages(sagemaker) == []
    [message] = published()
    assert message["Subject"] == "Training run rejected" and reason in message["Message"]


def test_f1_below_the_configured_minimum_is_rejected(world, monkeypatch):
    s3, sagemaker, _ = world
    monkeypatch.setenv("MIN_VALIDATION_F1", "0.8")
    result = register_model.handler(event(put_run(s3)), FakeContext())
    assert result["registered"] is False and "below the minimum 0.800" in result["reason"]
    assert packages(sagemaker) == []


@pytest.mark.parametrize(("payload", "reason"), [
    (event("models/sentiment/run-0007/model.tar.gz"), "is not a models/sentiment/<run_id>/_SUCCESS marker"),
    (event("models/other/run-1/_SUCCESS"), "is not a models/sentiment/<run_id>/_SUCCESS marker"),
    ({"detail": {}}, "not an S3 Object Created event"),
])
def test_events_that_are_not_a_success_marker_are_rejected(world, payload, reason):
    _, sagemaker, _ = world
    result = register_model.handler(payload, FakeContext())
    assert result["registered"] is False and reason in result["reason"]
    assert packages(sagemaker) == []
