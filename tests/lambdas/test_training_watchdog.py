"""training_watchdog: terminates only this project's overdue training instances, and says so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import boto3
import pytest

from lambdas.training_watchdog import handler as watchdog
from tests.lambdas.conftest import REGION, FakeContext


@pytest.fixture
def ec2(aws, topic, monkeypatch):
    monkeypatch.setenv("PROJECT", "mlrecipes")
    monkeypatch.setenv("ENVIRONMENT", "dev")
    monkeypatch.setenv("DEFAULT_MAX_HOURS", "6")
    return boto3.client("ec2", region_name=REGION), topic


def launch(ec2_client, **tags: str) -> str:
    image = ec2_client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tag_list = [{"Key": k.replace("_", "-"), "Value": v} for k, v in tags.items()]
    reservation = ec2_client.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="p4d.24xlarge",
                                           TagSpecifications=[{"ResourceType": "instance", "Tags": tag_list}])
    return reservation["Instances"][0]["InstanceId"]


def state(ec2_client, instance_id: str) -> str:
    reservations = ec2_client.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return reservations[0]["Instances"][0]["State"]["Name"]


def later(hours: float) -> datetime:
    return datetime.now(UTC) + timedelta(hours=hours)


def test_overdue_training_instance_is_terminated_and_reported(ec2):
    client, published = ec2
    ours = launch(client, project="mlrecipes", environment="dev", component="training", max_hours="2",
                  run_id="run-0001")
    result = watchdog.handler({}, FakeContext(), now=later(3))
    assert result == {"terminated": [ours]}
    assert state(client, ours) in ("shutting-down", "terminated")
    [message] = published()
    assert "run-0001" in message["Message"] and ours in message["Message"]


def test_instances_within_their_hours_or_not_ours_are_left_alone(ec2):
    client, published = ec2
    young = launch(client, project="mlrecipes", environment="dev", component="training", max_hours="8")
    other_env = launch(client, project="mlrecipes", environment="prod", component="training", max_hours="1")
    other_project = launch(client, project="someone-else", environment="dev", component="training", max_hours="1")
    not_training = launch(client, project="mlrecipes", environment="dev", component="bastion")
    result = watchdog.handler({}, FakeContext(), now=later(7))
    assert result == {"terminated": []}
    for instance in (young, other_env, other_project, not_training):
        assert state(client, instance) == "running"
    assert published() == []


def test_default_max_hours_applies_without_a_tag(ec2):
    client, _ = ec2
    untagged = launch(client, project="mlrecipes", environment="dev", component="training")
    assert watchdog.handler({}, FakeContext(), now=later(5))["terminated"] == []
    assert watchdog.handler({}, FakeContext(), now=later(6.5))["terminated"] == [untagged]
