"""The training stack: a self-terminating p4d run from the DLAMI, with least-privilege permissions."""

from __future__ import annotations

import re

import pytest
from aws_cdk.assertions import Match

SSM_AMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"


def _instance(template) -> dict:
    instances = template.find_resources("AWS::EC2::Instance")
    assert len(instances) == 1
    return next(iter(instances.values()))


def _literal_user_data(template) -> str:
    """The user data script with every token replaced by <token>, so the text can be searched in order."""
    joined = _instance(template)["Properties"]["UserData"]["Fn::Base64"]
    if isinstance(joined, str):
        return joined
    return "".join(part if isinstance(part, str) else "<token>" for part in joined["Fn::Join"][1])


def test_no_training_instance_by_default(synthesized):
    for config in ("dev", "prod"):
        assert not any(name.endswith("-training") for name in synthesized(config).templates)


def test_instance_type_ami_and_placement(synthesized):
    template = synthesized("prod-training").template("training")
    props = _instance(template)["Properties"]
    assert props["InstanceType"] == "p4d.24xlarge"
    parameter = props["ImageId"]["Ref"]
    assert template.to_json()["Parameters"][parameter] == {
        "Type": "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>", "Default": SSM_AMI}
    assert "Fn::ImportValue" in props["SubnetId"]
    assert "privateSubnet" in props["SubnetId"]["Fn::ImportValue"]
    assert props["Monitoring"] is True
    assert "KeyName" not in props


def test_imdsv2_required(synthesized):
    synthesized("prod-training").template("training").has_resource_properties("AWS::EC2::LaunchTemplate", {
        "LaunchTemplateData": {"MetadataOptions": {"HttpTokens": "required"}}})


def test_root_volume_is_encrypted_gp3_of_the_configured_size(synthesized):
    props = _instance(synthesized("prod-training").template("training"))["Properties"]
    ebs = props["BlockDeviceMappings"][0]["Ebs"]
    assert ebs["Encrypted"] is True and ebs["VolumeType"] == "gp3" and ebs["VolumeSize"] == 200
    assert "Fn::ImportValue" in ebs["KmsKeyId"]


def test_shutdown_terminates(synthesized):
    props = _instance(synthesized("prod-training").template("training"))["Properties"]
    assert props["InstanceInitiatedShutdownBehavior"] == "terminate"


def test_security_group_admits_nothing(synthesized):
    template = synthesized("prod-training").template("training")
    template.resource_count_is("AWS::EC2::SecurityGroupIngress", 0)
    for group in template.find_resources("AWS::EC2::SecurityGroup").values():
        assert "SecurityGroupIngress" not in group["Properties"]


def test_security_group_sends_only_https(synthesized):
    groups = synthesized("prod-training").template("training").find_resources("AWS::EC2::SecurityGroup")
    assert len(groups) == 1
    egress = next(iter(groups.values()))["Properties"]["SecurityGroupEgress"]
    assert egress == [{"CidrIp": "0.0.0.0/0", "Description": "HTTPS to AWS APIs and the model hub",
                       "FromPort": 443, "IpProtocol": "tcp", "ToPort": 443}]


def test_user_data_steps_run_in_order(synthesized):
    script = _literal_user_data(synthesized("prod-training").template("training"))
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script
    assert "export MAX_HOURS=6\n" in script
    assert "export RUN_ID=run-0001\n" in script
    assert "export SERVE_ON=ml.c7g.4xlarge\n" in script  # the endpoint's instance type: its CPU's int8 weights
    assert "--num-train-epochs 10 --learning-rate 1e-05 --per-device-train-batch-size 16" in script
    expected_order = [
        "trap finish EXIT",
        'shutdown -h "+${GUARD_MINUTES}"',
        ': "${RUN_ID:?}"',
        'mkdir -p "$(dirname "$LOG_FILE")"',
        'until mountpoint -q "$NVME_MOUNT"',
        "docker login --username AWS --password-stdin",
        'docker pull "$BASE_IMAGE"',
        "docker build",
        "--gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864",
        "torchrun --nproc_per_node",
        "python -m training.package",
        'step "upload"',
    ]
    positions = [script.find(marker) for marker in expected_order]
    assert all(p >= 0 for p in positions), dict(zip(expected_order, positions, strict=True))
    assert positions == sorted(positions), dict(zip(expected_order, positions, strict=True))
    upload = script[script.index('step "upload"'):]
    assert '"${PREFIX}/model.tar.gz"' in upload and '"${PREFIX}/metrics.json"' in upload
    # The exit handler writes the markers and shuts down on both paths.
    handler = script[script.index("finish() {"):script.index("trap finish EXIT")]
    for marker in ['"${PREFIX}/_SUCCESS"', '"${PREFIX}/_FAILED"', "shutdown -h now", '"${PREFIX}/checkpoints/"']:
        assert marker in handler


def test_dlc_registry_and_image_for_the_region(synthesized):
    script = _literal_user_data(synthesized("prod-training").template("training"))
    assert "export DLC_REGISTRY=763104351884.dkr.ecr.us-west-2.amazonaws.com\n" in script
    assert ("export BASE_IMAGE=763104351884.dkr.ecr.us-west-2.amazonaws.com/"
            "pytorch:2.13.0-cu133-amzn2023\n") in script


def test_a_new_run_id_replaces_the_instance(synthesized):
    first = synthesized("prod-training").template("training").find_resources("AWS::EC2::Instance")
    second = synthesized("prod-training-run2").template("training").find_resources("AWS::EC2::Instance")
    assert set(first) != set(second)


def test_instance_role_is_least_privilege(synthesized):
    template = synthesized("prod-training").template("training")
    template.has_resource_properties("AWS::IAM::Role", {"ManagedPolicyArns": Match.absent()})
    policies = template.find_resources("AWS::IAM::Policy")
    assert len(policies) == 1
    statements = next(iter(policies.values()))["Properties"]["PolicyDocument"]["Statement"]
    by_sid = {s["Sid"]: s for s in statements}
    assert set(by_sid) == {"PullTrainingImage", "RegistryLogin", "ReadCode", "WriteRunOutputs", "EncryptRunOutputs",
                           "WriteLogs", "SessionManager"}
    assert by_sid["PullTrainingImage"]["Resource"] == "arn:aws:ecr:us-west-2:763104351884:repository/pytorch"
    assert by_sid["RegistryLogin"]["Action"] == "ecr:GetAuthorizationToken"
    assert all("*" not in str(r) for r in by_sid["ReadCode"]["Resource"])
    assert by_sid["WriteRunOutputs"]["Action"] == ["s3:AbortMultipartUpload", "s3:PutObject"]
    # Only this run's own prefix: a run cannot overwrite another run's model or markers.
    assert by_sid["WriteRunOutputs"]["Resource"]["Fn::Join"][1][1] == "/models/sentiment/run-0001/*"
    assert by_sid["EncryptRunOutputs"]["Condition"] == {
        "StringEquals": {"kms:ViaService": "s3.us-west-2.amazonaws.com"}}
    assert by_sid["WriteLogs"]["Resource"]["Fn::GetAtt"][1] == "Arn"
    wildcard_sids = {s["Sid"] for s in statements if s["Resource"] == "*"}
    assert wildcard_sids == {"RegistryLogin", "SessionManager"}
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert not any(a.endswith(":*") or a == "*" for a in actions)


def test_log_group_is_encrypted_with_the_configured_retention(synthesized):
    synthesized("prod-training").template("training").has_resource_properties("AWS::Logs::LogGroup", {
        "RetentionInDays": 365, "KmsKeyId": Match.any_value()})


def test_outputs_tell_the_operator_what_comes_next(synthesized):
    template = synthesized("prod-training").template("training")
    outputs = template.to_json()["Outputs"]
    for name in ("InstanceId", "RunId", "ModelPrefix", "LogGroupName", "FollowLogCommand"):
        assert name in outputs
    assert outputs["RunId"]["Value"] == "run-0001"
    (instance_id,) = template.find_resources("AWS::EC2::Instance")
    assert outputs["InstanceId"]["Value"] == {"Ref": instance_id}
    (log_group_id,) = [key for key, group in template.find_resources("AWS::Logs::LogGroup").items()
                       if group["Properties"].get("RetentionInDays") == 365]
    assert outputs["LogGroupName"]["Value"] == {"Ref": log_group_id}
    prefix = outputs["ModelPrefix"]["Value"]["Fn::Join"][1]
    assert prefix[0] == "s3://" and re.fullmatch(r"/models/sentiment/run-0001/", prefix[2])
    follow = outputs["FollowLogCommand"]["Value"]["Fn::Join"][1]
    assert follow[0] == "aws logs tail " and follow[2] == " --follow --region us-west-2"


def test_user_data_names_the_nvme_and_no_hosting_image(synthesized):
    script = _literal_user_data(synthesized("prod-training").template("training"))
    assert "export NVME_MOUNT=/opt/dlami/nvme\n" in script  # p4d.24xlarge has 8 TB of instance storage
    # No wheels for a hosting image's Python (the retired TorchServe image's): our image carries every package.
    assert "SERVING_" not in script and "pip download" not in script


def test_no_zone_set_takes_the_first_private_subnet_and_no_reservation(synthesized):
    template = synthesized("prod-training").template("training")
    data = next(iter(template.find_resources("AWS::EC2::LaunchTemplate").values()))["Properties"]
    assert "CapacityReservationSpecification" not in data["LaunchTemplateData"]


def test_zone_and_capacity_reservation(synthesized):
    template = synthesized("prod-training-reserved").template("training")
    props = _instance(template)["Properties"]
    templates = template.find_resources("AWS::EC2::LaunchTemplate")
    assert len(templates) == 1
    name, launch_template = next(iter(templates.items()))
    assert launch_template["Properties"]["LaunchTemplateData"]["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}}
    assert launch_template["Properties"]["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] == "required"
    assert props["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": name}
    # The second zone's private subnet, not the first one.
    assert "privateSubnet2" in props["SubnetId"]["Fn::ImportValue"]


@pytest.mark.parametrize(("overrides", "fragments"), [
    ({"training.capacity_reservation_id": "cr-0123456789abcdef0"},
     ["training.availability_zone=null", "the zone of training.capacity_reservation_id"]),
    ({"training.availability_zone": "us-west-2c", "network.availability_zones": "us-west-2a,us-west-2b"},
     ["training.availability_zone='us-west-2c'", "one of network.availability_zones (us-west-2a, us-west-2b)"]),
    ({"training.availability_zone": "us-west-2a"}, ["network.availability_zones (unset: set them too)"]),
])
def test_settings_the_training_stack_refuses(overrides, fragments):
    from settings import SettingsError, load_settings
    from stacks.environment import build_environment, new_app

    settings = load_settings("prod", {"training.enabled": "true", **overrides})
    with pytest.raises(SettingsError) as caught:
        build_environment(new_app(), settings)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_instance_storage_table():
    from stacks.instances import has_instance_storage

    assert all(has_instance_storage(t) for t in ("p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "g5.xlarge",
                                                 "g6e.12xlarge", "g4dn.xlarge", "m5dn.large"))
    assert not any(has_instance_storage(t) for t in ("p3.16xlarge", "c5n.large", "m5.large", "c6g.large"))


def test_the_encrypted_root_volume_is_the_amazon_linux_amis_root_device(synthesized):
    from stacks.training import root_device_name

    props = _instance(synthesized("prod-training").template("training"))["Properties"]
    [mapping] = props["BlockDeviceMappings"]
    assert mapping["DeviceName"] == "/dev/xvda"  # Amazon Linux 2023 AMIs boot from xvda (Ubuntu DLAMIs: sda1)
    assert mapping["Ebs"]["Encrypted"] is True and mapping["Ebs"]["VolumeSize"] == 200
    assert root_device_name("/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/"
                            "ami-id") == "/dev/sda1"
