"""Upgrade from the last release: today's templates against the release's (tests/upgrade_baseline/, prod, every
workload on). An update must not remove or replace a stateful resource, nor add a named resource that an older
environment may already have (CloudFormation then fails with "already exists").

Replacement is decided by CloudFormation's own rules as cfn-lint ships them offline (the pinned cfn-lint's provider
schemas, `cfnlint.schema.manager.PROVIDER_SCHEMA_MANAGER`, us-west-2): a change to any of a type's
`createOnlyProperties` (or `conditionalCreateOnlyProperties`) replaces the resource; a changed type for the same
logical id is refused ("Update of resource type is not permitted"); a resource gone from the template is deleted
unless its DeletionPolicy in the release's template retains it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from cfnlint.schema.manager import PROVIDER_SCHEMA_MANAGER

from tests.upgrade_baseline.refresh import CONTEXT

BASELINE = Path(__file__).resolve().parent / "upgrade_baseline"
SCHEMA_REGION = "us-west-2"
# What holds data or identity an environment cannot lose: buckets, keys, log groups, topics, queues, the VPC,
# endpoints, model package groups; and our adopting log group resource (stacks/endpoint_logs.py).
STATEFUL = {"AWS::S3::Bucket", "AWS::KMS::Key", "AWS::Logs::LogGroup", "AWS::SNS::Topic", "AWS::SQS::Queue",
            "AWS::EC2::VPC", "AWS::SageMaker::Endpoint", "AWS::SageMaker::ModelPackageGroup",
            "Custom::EndpointLogGroup"}
# Custom resources that adopt what exists instead of failing on it: a name they carry is not a collision.
ADOPTING = {"Custom::EndpointLogGroup"}
RETAINED = {"Retain", "RetainExceptOnCreate", "Snapshot"}
# Changes reviewed and accepted, by (stack, logical id): the exact problem and why it is taken. A different problem
# at the same place, or an entry that no longer occurs, fails the test.
TYPE_CHANGE = "changes the type AWS::Logs::LogGroup -> Custom::EndpointLogGroup"
WHY_TYPE_CHANGE = (
    "Issue 23.9. Environments from before 526689a have no such resource; the custom resource adopts the group "
    "SageMaker made. Environments deployed from 526689a..e48dc78 keep the same logical id on purpose: CloudFormation "
    "refuses the type change when it creates the change set, before it touches anything (README, Upgrades), where a "
    "new logical id would delete their group in the clean-up phase.")
ACCEPTED = {
    ("mlrecipes-prod-sentiment", "EndpointLogsC54E4891"): (TYPE_CHANGE, WHY_TYPE_CHANGE),
    ("mlrecipes-prod-falcon", "EndpointLogsC54E4891"): (TYPE_CHANGE, WHY_TYPE_CHANGE),
}


def _schema(resource_type: str) -> dict:
    return PROVIDER_SCHEMA_MANAGER.get_resource_schema(SCHEMA_REGION, resource_type).schema


def _pointer(properties: dict, pointer: str):
    """The value at a schema pointer such as /properties/LogGroupName (None when absent)."""
    value = {"properties": properties}
    for part in pointer.strip("/").split("/"):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def replacing_changes(resource_type: str, old: dict, new: dict) -> list[str]:
    """The properties whose change replaces the resource, by the type's schema (custom types: none known)."""
    if resource_type.startswith("Custom::"):
        return []
    schema = _schema(resource_type)
    pointers = schema.get("createOnlyProperties", []) + schema.get("conditionalCreateOnlyProperties", [])
    return [pointer.removeprefix("/properties/") for pointer in pointers
            if _pointer(old, pointer) != _pointer(new, pointer)]


def name_property(resource_type: str) -> str | None:
    """The physical-name property of a type: `<Type>Name` when the schema makes it create-only (LogGroupName,
    BucketName, TopicName, QueueName, EndpointName, ModelPackageGroupName, RoleName, AlarmName, ...)."""
    if resource_type.startswith("Custom::"):
        return None
    name = resource_type.rsplit("::", 1)[1] + "Name"
    return name if f"/properties/{name}" in _schema(resource_type).get("createOnlyProperties", []) else None


def upgrade_problems(release: dict[str, dict], today: dict[str, dict]) -> dict[tuple[str, str], str]:
    """(stack, logical id) -> what an update from `release` to `today` would do that an environment cannot take."""
    problems = {}
    for stack, template in release.items():
        resources = today.get(stack, {}).get("Resources", {})
        for logical_id, old in template.get("Resources", {}).items():
            if old["Type"] not in STATEFUL:
                continue
            new = resources.get(logical_id)
            if new is None:
                if old.get("DeletionPolicy") not in RETAINED:
                    problems[stack, logical_id] = f"removes {old['Type']} (deletion policy "\
                                                  f"{old.get('DeletionPolicy', 'Delete')})"
            elif new["Type"] != old["Type"]:
                problems[stack, logical_id] = f"changes the type {old['Type']} -> {new['Type']}"
            else:
                changed = replacing_changes(old["Type"], old.get("Properties", {}), new.get("Properties", {}))
                if changed:
                    problems[stack, logical_id] = f"replaces {old['Type']}: {', '.join(changed)} changed"
    for stack, template in today.items():
        before = release.get(stack, {}).get("Resources", {})
        for logical_id, new in template.get("Resources", {}).items():
            name = name_property(new["Type"])
            if logical_id in before or new["Type"] in ADOPTING or name is None:
                continue
            if name in new.get("Properties", {}):
                problems[stack, logical_id] = (f"adds {new['Type']} named {json.dumps(new['Properties'][name])}, "
                                               "which an older environment may already have")
    return problems


def release_templates() -> dict[str, dict]:
    return {path.name.removesuffix(".template.json"): json.loads(path.read_text())
            for path in sorted((BASELINE / "templates").glob("*.template.json"))}


def test_the_baseline_is_the_release_in_the_configuration_compared():
    baseline = json.loads((BASELINE / "baseline.json").read_text())
    assert baseline["context"] == CONTEXT and len(baseline["commit"]) == 40
    assert sorted(release_templates()) == baseline["stacks"] and len(baseline["stacks"]) == 6


def test_an_upgrade_from_the_last_release_keeps_every_stateful_resource(synthesized):
    today = synthesized("prod-all-on").templates
    problems = upgrade_problems(release_templates(), today)
    unreviewed = {key: problem for key, problem in problems.items() if key not in ACCEPTED}
    assert unreviewed == {}
    assert {key: problems.get(key) for key in ACCEPTED} == {key: expected for key, (expected, _) in ACCEPTED.items()}


def test_the_release_compared_is_a_torchserve_deployment_so_the_check_covers_its_upgrade(synthesized):
    """Issue 43: the baseline release hosts sentiment on the retired TorchServe image (sentiment.runtime=dlc, then the
    default), today's on our serving image; the check above is therefore the upgrade of such an environment. When
    the baseline is refreshed to a release after issue 43, this test has served its purpose: delete it."""
    def image(templates: dict) -> str:
        [model] = [r for r in templates["mlrecipes-prod-sentiment"]["Resources"].values()
                   if r["Type"] == "AWS::SageMaker::Model"]
        return json.dumps(model["Properties"]["PrimaryContainer"]["Image"])

    assert "/pytorch-inference-arm64:2.6.0-cpu-py312-ubuntu22.04-sagemaker" in image(release_templates())
    assert "-container-assets-" in image(synthesized("prod-all-on").templates)


# --- the check can fail ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def release():
    return release_templates()


def _find(templates: dict, stack: str, resource_type: str) -> str:
    return next(key for key, r in templates[stack]["Resources"].items() if r["Type"] == resource_type)


def test_a_replaced_vpc_a_renamed_bucket_and_a_removed_key_are_caught(release):
    today = copy.deepcopy(release)
    network, artifacts = today["mlrecipes-prod-network"], today["mlrecipes-prod-artifacts"]
    vpc = _find(today, "mlrecipes-prod-network", "AWS::EC2::VPC")
    network["Resources"][vpc]["Properties"]["CidrBlock"] = "10.99.0.0/16"
    bucket = _find(today, "mlrecipes-prod-artifacts", "AWS::S3::Bucket")
    artifacts["Resources"][bucket]["Properties"]["BucketName"] = "renamed"
    key = _find(today, "mlrecipes-prod-artifacts", "AWS::KMS::Key")
    policy = release["mlrecipes-prod-artifacts"]["Resources"][key].get("DeletionPolicy")
    del artifacts["Resources"][key]
    problems = upgrade_problems(release, today)
    assert problems["mlrecipes-prod-network", vpc] == "replaces AWS::EC2::VPC: CidrBlock changed"
    assert problems["mlrecipes-prod-artifacts", bucket] == "replaces AWS::S3::Bucket: BucketName changed"
    if policy in RETAINED:  # a retained key outlives its removal from the template
        assert ("mlrecipes-prod-artifacts", key) not in problems
    else:
        assert problems["mlrecipes-prod-artifacts", key].startswith("removes AWS::KMS::Key")
    assert upgrade_problems(release, release) == {}


def test_a_plain_log_group_that_sagemaker_may_have_made_is_caught(release):
    """The defect of issue 23.9: a release without the endpoint's log group, and an update that declares it as an
    AWS::Logs::LogGroup. The adopting custom resource in its place passes."""
    older = copy.deepcopy(release)
    sentiment = older["mlrecipes-prod-sentiment"]["Resources"]
    (log_id,) = [key for key, r in sentiment.items()
                 if r["Type"] == "AWS::Logs::LogGroup" and "Endpoints" in json.dumps(r["Properties"])]
    del sentiment[log_id]
    problems = upgrade_problems(older, release)
    assert problems == {("mlrecipes-prod-sentiment", log_id):
                        'adds AWS::Logs::LogGroup named "/aws/sagemaker/Endpoints/prod-sentiment", which an older '
                        "environment may already have"}
    adopting = copy.deepcopy(release)
    group = adopting["mlrecipes-prod-sentiment"]["Resources"][log_id]
    group["Type"] = "Custom::EndpointLogGroup"
    assert ("mlrecipes-prod-sentiment", log_id) not in upgrade_problems(older, adopting)


def test_name_properties_come_from_the_schemas():
    assert name_property("AWS::Logs::LogGroup") == "LogGroupName"
    assert name_property("AWS::SageMaker::Endpoint") == "EndpointName"
    assert name_property("AWS::SNS::Topic") == "TopicName"
    assert name_property("AWS::KMS::Key") is None  # keys have no name; aliases do
