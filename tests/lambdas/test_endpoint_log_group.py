"""endpoint_log_group: creates the endpoint's log group if missing, adopts it if SageMaker made it, never deletes.

CloudWatch Logs is moto's. moto has no AssociateKmsKey, so that one call is recorded by a botocore `before-call`
hook that answers it as the API does on success (an empty response); everything else reaches moto.
"""

from __future__ import annotations

import json
import time

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from lambdas.endpoint_log_group import handler as endpoint_log_group
from tests.lambdas.conftest import REGION

NAME = "/aws/sagemaker/Endpoints/prod-sentiment"
KEY = f"arn:aws:kms:{REGION}:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def event(request_type: str, **properties) -> dict:
    return {"RequestType": request_type, "ResponseURL": "https://cloudformation-custom-resource-response.example/x",
            "StackId": "arn:aws:cloudformation:us-west-2:123456789012:stack/mlrecipes-prod-sentiment/1",
            "RequestId": "request-1", "LogicalResourceId": "EndpointLogsResource", "ResourceType":
            "Custom::EndpointLogGroup", "ResourceProperties": {"ServiceToken": "arn:aws:lambda:x",
                                                               "LogGroupName": NAME, "RetentionInDays": "90",
                                                               "KmsKeyArn": KEY, **properties}}


@pytest.fixture
def logs(aws, monkeypatch):
    """moto's CloudWatch Logs for the handler; AssociateKmsKey calls recorded; CloudFormation's answers kept."""
    client = boto3.client("logs", region_name=REGION)
    associated: list[dict] = []

    def associate(params, **_):
        associated.append(json.loads(params["body"]))  # the serialized request
        return AWSResponse("https://logs.us-west-2.amazonaws.com/", 200, {}, None), {}  # success: an empty body

    client.meta.events.register("before-call.cloudwatch-logs.AssociateKmsKey", associate)
    monkeypatch.setattr(endpoint_log_group.boto3, "client", lambda service: client)
    answers: list[dict] = []
    monkeypatch.setattr(endpoint_log_group, "respond",
                        lambda _event, _context, status, physical_id, data=None, reason=None:
                        answers.append({"Status": status, "PhysicalResourceId": physical_id, "Data": data,
                                        "Reason": reason}))
    return client, associated, answers


def group(client) -> dict | None:
    found = [g for g in client.describe_log_groups(logGroupNamePrefix=NAME)["logGroups"] if g["logGroupName"] == NAME]
    return found[0] if found else None


def test_creates_a_missing_group_with_the_key_and_retention(logs):
    client, associated, answers = logs
    endpoint_log_group.handler(event("Create"), None)
    assert answers == [{"Status": "SUCCESS", "PhysicalResourceId": NAME, "Data": {"LogGroupName": NAME},
                        "Reason": None}]
    created = group(client)
    assert created["kmsKeyId"] == KEY and created["retentionInDays"] == 90
    assert associated == []


def test_adopts_the_group_sagemaker_created_and_keeps_its_events(logs):
    client, associated, answers = logs
    client.create_log_group(logGroupName=NAME)  # SageMaker's: no key, kept forever
    client.create_log_stream(logGroupName=NAME, logStreamName="AllTraffic/i-0123")
    client.put_log_events(logGroupName=NAME, logStreamName="AllTraffic/i-0123",
                          logEvents=[{"timestamp": int(time.time() * 1000), "message": "model loaded"}])
    endpoint_log_group.handler(event("Create"), None)
    assert answers[0]["Status"] == "SUCCESS" and answers[0]["PhysicalResourceId"] == NAME
    assert associated == [{"logGroupName": NAME, "kmsKeyId": KEY}]
    assert group(client)["retentionInDays"] == 90
    events = client.get_log_events(logGroupName=NAME, logStreamName="AllTraffic/i-0123")["events"]
    assert [e["message"] for e in events] == ["model loaded"]


def test_update_sets_the_new_retention(logs):
    client, _, answers = logs
    endpoint_log_group.handler(event("Create"), None)
    endpoint_log_group.handler({**event("Update", RetentionInDays="365"), "PhysicalResourceId": NAME}, None)
    assert [a["Status"] for a in answers] == ["SUCCESS", "SUCCESS"]
    assert group(client)["retentionInDays"] == 365


def test_delete_leaves_the_group_and_its_logs(logs):
    client, _, answers = logs
    endpoint_log_group.handler(event("Create"), None)
    endpoint_log_group.handler({**event("Delete"), "PhysicalResourceId": NAME}, None)
    assert answers[-1]["Status"] == "SUCCESS" and answers[-1]["PhysicalResourceId"] == NAME
    assert group(client) is not None


def test_a_failure_is_reported_failed_with_the_reason(logs):
    """CloudFormation must hear of a failure, or the stack waits an hour for the answer."""
    _, _, answers = logs
    request = event("Create")
    del request["ResourceProperties"]["KmsKeyArn"]
    endpoint_log_group.handler(request, None)
    (answer,) = answers
    assert answer["Status"] == "FAILED" and answer["PhysicalResourceId"] == "EndpointLogsResource"
    assert answer["Reason"] == "KeyError: 'KmsKeyArn'"


def test_the_answer_is_the_custom_resource_response_put_to_the_presigned_url(monkeypatch):
    sent = []

    class Response:
        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

        def read(self):
            return b""

    def urlopen(request, timeout):
        sent.append((request.get_method(), request.full_url, json.loads(request.data), timeout))
        return Response()

    monkeypatch.setattr(endpoint_log_group.urllib.request, "urlopen", urlopen)
    endpoint_log_group.respond(event("Create"), None, "SUCCESS", NAME, data={"LogGroupName": NAME})
    ((method, url, body, timeout),) = sent
    assert method == "PUT" and url == event("Create")["ResponseURL"] and timeout == 30
    assert body == {"Status": "SUCCESS", "PhysicalResourceId": NAME, "StackId": event("Create")["StackId"],
                    "RequestId": "request-1", "LogicalResourceId": "EndpointLogsResource",
                    "Reason": "see CloudWatch log stream ", "Data": {"LogGroupName": NAME}}
