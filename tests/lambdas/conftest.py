"""moto-backed AWS for the Lambda handlers: no network, no credentials."""

from __future__ import annotations

import json
from dataclasses import dataclass

import boto3
import pytest
from moto import mock_aws

REGION = "us-west-2"


@dataclass
class FakeContext:
    """What Powertools' inject_lambda_context reads from the Lambda context."""

    function_name: str = "test-function"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:123456789012:function:test-function"
    aws_request_id: str = "request-1"


@pytest.fixture
def aws(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION,
                        "POWERTOOLS_METRICS_NAMESPACE": "MlRecipesTest"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield


@pytest.fixture
def topic(aws, monkeypatch):
    """An SNS topic with an SQS queue subscribed, so tests can read what was published."""
    sns, sqs = boto3.client("sns", region_name=REGION), boto3.client("sqs", region_name=REGION)
    topic_arn = sns.create_topic(Name="alarms")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="alarm-inbox")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)
    monkeypatch.setenv("TOPIC_ARN", topic_arn)

    def published() -> list[dict]:
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
        return [json.loads(m["Body"]) for m in messages]

    return published
