"""CloudFormation custom resource: an endpoint's log group, created if missing and adopted if SageMaker made it.

SageMaker creates `/aws/sagemaker/Endpoints/<endpoint>` on an endpoint's first log line (no retention, no key of
ours). An AWS::Logs::LogGroup of that name fails to create where the group already exists, so an upgrade of an
environment whose endpoint has logged would stop until someone deletes or imports the group. This resource
creates the group only if it is missing, then sets the key and retention either way. It never deletes the group:
the logs outlive the stack, as a retained log group's would.

Properties: LogGroupName, RetentionInDays (one of CloudWatch's periods), KmsKeyArn. Plain Python and boto3 (in
the Lambda runtime), so it needs no layer.
"""

from __future__ import annotations

import json
import urllib.request

import boto3


def handler(event: dict, context) -> None:
    """Answer CloudFormation on every path: a custom resource that never answers blocks the stack for an hour."""
    physical_id = event.get("PhysicalResourceId") or event["LogicalResourceId"]
    try:
        physical_id = apply(event, boto3.client("logs"))
        respond(event, context, "SUCCESS", physical_id, data={"LogGroupName": physical_id})
    except Exception as error:  # every failure reaches CloudFormation as FAILED
        print(f"FAILED {event['RequestType']} {physical_id}: {type(error).__name__}: {error}")
        respond(event, context, "FAILED", physical_id, reason=f"{type(error).__name__}: {error}")


def apply(event: dict, logs) -> str:
    """The log group's name (the physical id). A Delete (or the old name after a rename) leaves the group."""
    if event["RequestType"] == "Delete":
        return event["PhysicalResourceId"]
    properties = event["ResourceProperties"]
    name, key = properties["LogGroupName"], properties["KmsKeyArn"]
    try:
        logs.create_log_group(logGroupName=name, kmsKeyId=key)
        print(f"created {name}")
    except logs.exceptions.ResourceAlreadyExistsException:
        logs.associate_kms_key(logGroupName=name, kmsKeyId=key)
        print(f"adopted {name}: key associated (new log events are encrypted with it)")
    logs.put_retention_policy(logGroupName=name, retentionInDays=int(properties["RetentionInDays"]))
    return name


def respond(event: dict, context, status: str, physical_id: str, *, data: dict | None = None,
            reason: str | None = None) -> None:
    """PUT the result to the pre-signed S3 URL CloudFormation waits on (the custom resource response contract)."""
    log_stream = getattr(context, "log_stream_name", "")
    body = json.dumps({
        "Status": status, "PhysicalResourceId": physical_id, "StackId": event["StackId"],
        "RequestId": event["RequestId"], "LogicalResourceId": event["LogicalResourceId"],
        "Reason": (reason or f"see CloudWatch log stream {log_stream}")[:3000], "Data": data or {},
    }).encode()
    request = urllib.request.Request(event["ResponseURL"], data=body, method="PUT",
                                     headers={"Content-Type": "", "Content-Length": str(len(body))})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
