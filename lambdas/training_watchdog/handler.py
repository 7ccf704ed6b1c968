"""Terminates this project's training instances that run past their max hours, and reports what it did.

Terminate, not stop: a stopped instance still pays for its volume and holds its capacity reservation slot,
and started again it would rerun nothing (user data runs once at first boot).

The instance's own shutdown timer is the first guard; this is the second, for the case where the timer
never ran (user data failed before it, or someone cancelled it in a session).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

logger = Logger(service="training-watchdog")
metrics = Metrics(namespace=os.environ.get("METRICS_NAMESPACE", "MlRecipes"), service="training-watchdog")


def overdue_instances(ec2, project: str, environment: str, default_max_hours: float, now: datetime) -> list[dict]:
    """Running training instances of this project and environment older than their max-hours tag."""
    filters = [
        {"Name": "tag:project", "Values": [project]},
        {"Name": "tag:environment", "Values": [environment]},
        {"Name": "tag:component", "Values": ["training"]},
        {"Name": "instance-state-name", "Values": ["running"]},
    ]
    overdue = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                try:
                    limit = float(tags.get("max-hours", default_max_hours))
                except ValueError:
                    limit = default_max_hours
                hours = (now - instance["LaunchTime"]).total_seconds() / 3600
                if hours > limit:
                    overdue.append({"instance_id": instance["InstanceId"], "hours": round(hours, 2),
                                    "max_hours": limit, "run_id": tags.get("run-id", "?")})
    return overdue


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict, context: object, now: datetime | None = None) -> dict:
    ec2, sns = boto3.client("ec2"), boto3.client("sns")
    overdue = overdue_instances(ec2, os.environ["PROJECT"], os.environ["ENVIRONMENT"],
                                float(os.environ.get("DEFAULT_MAX_HOURS", "6")), now or datetime.now(UTC))
    if overdue:
        ec2.terminate_instances(InstanceIds=[o["instance_id"] for o in overdue])
        lines = [f"{o['instance_id']} (run {o['run_id']}): {o['hours']} h > {o['max_hours']} h" for o in overdue]
        logger.warning("terminated overdue training instances", instances=overdue)
        topic = os.environ.get("TOPIC_ARN")
        if topic:
            sns.publish(TopicArn=topic, Subject="Training instances terminated by the watchdog",
                        Message="Terminated training instances past their max hours:\n" + "\n".join(lines))
    else:
        logger.info("no overdue training instances")
    metrics.add_metric(name="InstancesTerminated", unit=MetricUnit.Count, value=len(overdue))
    return {"terminated": [o["instance_id"] for o in overdue]}
