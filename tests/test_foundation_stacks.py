"""Network and artifact stacks: the security properties the foundation promises, read off the templates."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from aws_cdk.assertions import Match

from stacks.nag import acknowledge


def test_stack_names_carry_the_environment(synthesized):
    for env_name in ("dev", "prod"):
        assert sorted(synthesized(env_name).templates) == [
            f"mlrecipes-{env_name}-artifacts", f"mlrecipes-{env_name}-network", f"mlrecipes-{env_name}-operations"]


def test_key_rotates_and_is_retained(synthesized):
    template = synthesized("dev").template("artifacts")
    template.has_resource("AWS::KMS::Key", {
        "Properties": {"EnableKeyRotation": True},
        "DeletionPolicy": "Retain",
        "UpdateReplacePolicy": "Retain",
    })


def test_artifact_bucket_is_encrypted_versioned_private_logged_and_retained(synthesized):
    template = synthesized("prod").template("artifacts")
    template.has_resource("AWS::S3::Bucket", {
        "DeletionPolicy": "Retain",
        "Properties": {
            "BucketEncryption": {"ServerSideEncryptionConfiguration": [{
                "BucketKeyEnabled": True,
                "ServerSideEncryptionByDefault": {
                    "SSEAlgorithm": "aws:kms",
                    "KMSMasterKeyID": {"Fn::GetAtt": [Match.string_like_regexp("^Key"), "Arn"]},
                },
            }]},
            "VersioningConfiguration": {"Status": "Enabled"},
            "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                               "IgnorePublicAcls": True, "RestrictPublicBuckets": True},
            "LoggingConfiguration": {"DestinationBucketName": {"Ref": Match.string_like_regexp("^AccessLogs")},
                                     "LogFilePrefix": "artifacts/"},
            "LifecycleConfiguration": {"Rules": Match.array_with([Match.object_like({
                "NoncurrentVersionExpiration": {"NoncurrentDays": 365}, "Status": "Enabled"})])},
        },
    })


def test_noncurrent_expiry_follows_the_environment(synthesized):
    synthesized("dev").template("artifacts").has_resource_properties("AWS::S3::Bucket", {
        "LifecycleConfiguration": {"Rules": Match.array_with([Match.object_like({
            "NoncurrentVersionExpiration": {"NoncurrentDays": 30}})])},
    })


def test_both_buckets_refuse_plain_http(synthesized):
    template = synthesized("dev").template("artifacts")
    policies = template.find_resources("AWS::S3::BucketPolicy")
    assert len(policies) == 2
    for policy in policies.values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
                   for s in statements)


def _only_id(template, kind: str, **properties) -> str:
    """The logical id of the one resource of `kind` whose properties include `properties` (by key presence)."""
    (logical_id,) = [key for key, resource in template.find_resources(kind).items()
                     if all((name in resource["Properties"]) == present for name, present in properties.items())]
    return logical_id


def test_artifact_outputs_point_at_the_artifact_bucket_and_its_key(synthesized):
    template = synthesized("dev").template("artifacts")
    outputs = template.to_json()["Outputs"]
    artifacts = _only_id(template, "AWS::S3::Bucket", LoggingConfiguration=True)  # the access-log bucket has none
    access_logs = _only_id(template, "AWS::S3::Bucket", LoggingConfiguration=False)
    key = _only_id(template, "AWS::KMS::Key")
    assert outputs["ArtifactBucketName"]["Value"] == {"Ref": artifacts}
    assert outputs["ArtifactBucketArn"]["Value"] == {"Fn::GetAtt": [artifacts, "Arn"]}
    assert outputs["AccessLogBucketName"]["Value"] == {"Ref": access_logs}
    assert outputs["KeyArn"]["Value"] == {"Fn::GetAtt": [key, "Arn"]}


def test_vpc_spans_two_zones_with_private_subnets(synthesized):
    template = synthesized("dev").template("network")
    template.resource_count_is("AWS::EC2::VPC", 1)
    subnets = template.find_resources("AWS::EC2::Subnet")
    private = [s for name, s in subnets.items() if "private" in name]
    assert len(private) == 2
    zones = {json.dumps(s["Properties"]["AvailabilityZone"]) for s in private}
    assert len(zones) == 2
    # Public subnets hold only the NAT gateways (Elastic IPs): no subnet hands out public addresses.
    assert len(subnets) == 4 and all(s["Properties"]["MapPublicIpOnLaunch"] is False for s in subnets.values())


def test_eventbridge_may_use_the_key_for_the_alarm_topic_and_its_dead_letter_queues(synthesized):
    key = next(iter(synthesized("dev").template("artifacts").find_resources("AWS::KMS::Key").values()))
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    events = [s for s in statements if "events.amazonaws.com" in str(s.get("Principal", {}).get("Service"))]
    assert len(events) == 1 and set(events[0]["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    assert "aws:SourceAccount" in events[0]["Condition"]["StringEquals"]


@pytest.mark.parametrize(("config", "nat_gateways"), [("dev", 1), ("prod", 2)])
def test_nat_gateway_count_follows_the_environment(synthesized, config, nat_gateways):
    synthesized(config).template("network").resource_count_is("AWS::EC2::NatGateway", nat_gateways)


def test_flow_logs_go_to_an_encrypted_log_group(synthesized):
    template = synthesized("prod").template("network")
    template.has_resource_properties("AWS::EC2::FlowLog", {"TrafficType": "ALL", "ResourceType": "VPC"})
    template.has_resource_properties("AWS::Logs::LogGroup", {
        "RetentionInDays": 365,
        "KmsKeyId": {"Fn::ImportValue": Match.string_like_regexp("Key")},
    })


def test_key_policy_lets_cloudwatch_logs_use_the_key_only_for_this_accounts_log_groups(synthesized):
    key = next(iter(synthesized("dev").template("artifacts").find_resources("AWS::KMS::Key").values()))
    logs_statements = [s for s in key["Properties"]["KeyPolicy"]["Statement"]
                       if "Service" in s["Principal"] and "logs" in json.dumps(s["Principal"])]
    assert len(logs_statements) == 1
    assert "kms:EncryptionContext:aws:logs:arn" in logs_statements[0]["Condition"]["ArnLike"]


INTERFACE_SERVICES = ["sagemaker.api", "sagemaker.runtime", "ecr.api", "ecr.dkr", "logs", "ssm", "ssmmessages",
                      "ec2messages", "sts"]


def _service_names(template) -> list[str]:
    """Interface endpoint service names (plain strings); the S3 gateway's is a Join on the region."""
    return [e["Properties"]["ServiceName"] for e in template.find_resources("AWS::EC2::VPCEndpoint").values()
            if e["Properties"]["VpcEndpointType"] == "Interface"]


def test_endpoints_for_every_service_the_workloads_call(synthesized):
    template = synthesized("dev").template("network")
    assert sorted(_service_names(template)) == sorted(f"com.amazonaws.us-west-2.{s}" for s in INTERFACE_SERVICES)
    template.has_resource_properties("AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Gateway"})
    template.has_resource_properties("AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Interface",
                                                               "PrivateDnsEnabled": True})


def test_each_endpoint_can_be_switched_off(synthesized):
    names = _service_names(synthesized("prod-account").template("network"))
    assert sorted(names) == sorted(f"com.amazonaws.eu-central-2.{s}" for s in INTERFACE_SERVICES if s != "sts")


def test_endpoint_security_groups_admit_https_from_the_vpc_only(synthesized):
    template = synthesized("dev").template("network")
    groups = template.find_resources("AWS::EC2::SecurityGroup")
    ingress_rules = [rule for g in groups.values() for rule in g["Properties"].get("SecurityGroupIngress", [])]
    assert len(ingress_rules) == len(INTERFACE_SERVICES)
    for rule in ingress_rules:
        assert (rule["CidrIp"], rule["FromPort"], rule["ToPort"], rule["IpProtocol"]) == \
            ("10.40.0.0/16", 443, 443, "tcp")


def test_account_bound_stacks_use_given_zones_and_region_without_lookups(synthesized):
    synth = synthesized("prod-account")
    template = synth.template("network")
    zones = {s["Properties"]["AvailabilityZone"] for s in template.find_resources("AWS::EC2::Subnet").values()}
    assert zones == {"eu-central-2a", "eu-central-2b"}
    manifest = json.loads((synth.outdir / "manifest.json").read_text())
    assert "missing" not in manifest, "synth asked for context lookups"


def test_every_resource_is_tagged_with_project_and_environment(synthesized):
    template = synthesized("prod").template("network")
    template.has_resource_properties("AWS::EC2::VPC", {"Tags": Match.array_with([
        {"Key": "environment", "Value": "prod"}, {"Key": "project", "Value": "mlrecipes"}])})
    synthesized("prod").template("artifacts").has_resource_properties("AWS::S3::Bucket", {
        "Tags": Match.array_with([{"Key": "environment", "Value": "prod"}])})


def test_network_outputs_point_at_the_vpc_and_the_group_its_flow_log_writes(synthesized):
    template = synthesized("dev").template("network")
    outputs = template.to_json()["Outputs"]
    assert outputs["VpcId"]["Value"] == {"Ref": _only_id(template, "AWS::EC2::VPC")}
    (flow_log,) = template.find_resources("AWS::EC2::FlowLog").values()
    assert flow_log["Properties"]["LogGroupName"] == outputs["FlowLogGroupName"]["Value"]
    assert outputs["FlowLogGroupName"]["Value"] == {"Ref": _only_id(template, "AWS::Logs::LogGroup")}


def test_cdk_nag_is_active_and_fails_an_insecure_stack(tmp_path):
    """The session's clean synths mean something only if the same wiring rejects a bad bucket."""
    script = f"""
import aws_cdk as cdk
from aws_cdk import aws_s3 as s3
from stacks.environment import new_app
from stacks.nag import add_checks
app = new_app(outdir={str(tmp_path)!r})
stack = cdk.Stack(app, "Insecure")
s3.Bucket(stack, "Open")
add_checks(app)
try:
    app.synth()
except RuntimeError as error:
    print("FAILED:", error)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "FAILED: ValidationFailed" in result.stdout, result.stderr[-2000:]
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for p in report["pluginReports"] for v in p["violations"]}
    assert {"AwsSolutions-S1", "AwsSolutions-S10"} <= rules


def test_acknowledging_without_a_reason_is_refused():
    with pytest.raises(ValueError, match="needs a reason"):
        acknowledge(None, "S1", "  ")
