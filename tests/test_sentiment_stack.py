"""The Graviton sentiment endpoint: image per region, isolation, encryption, safe updates, scaling."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match

from settings import SettingsError, load_settings
from stacks.sentiment import GRAVITON_IMAGES, check, container_environment, graviton_image_uri, vcpus

MODEL_URL = "s3://example-bucket/models/sentiment/run-0001/model.tar.gz"


def _one(template, kind: str) -> dict:
    found = template.find_resources(kind)
    assert len(found) == 1, f"{kind}: {list(found)}"
    return next(iter(found.values()))


def test_no_sentiment_stack_unless_enabled(synthesized):
    assert not any(name.endswith("-sentiment") for name in synthesized("prod").templates)


@pytest.mark.parametrize(("config", "image"), [
    ("prod-sentiment",
     "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-inference-arm64:2.6.0-cpu-py312-ubuntu22.04-sagemaker"),
    ("dev-sentiment-af",
     "626614931356.dkr.ecr.af-south-1.amazonaws.com/pytorch-inference-arm64:2.6.0-cpu-py312-ubuntu22.04-sagemaker"),
])
def test_image_uri_for_the_region(synthesized, config, image):
    model = _one(synthesized(config).template("sentiment"), "AWS::SageMaker::Model")
    assert model["Properties"]["PrimaryContainer"]["Image"] == image


def test_model_is_isolated_in_private_subnets_with_the_handler_and_graviton_tuning(synthesized):
    template = synthesized("prod-sentiment").template("sentiment")
    model = _one(template, "AWS::SageMaker::Model")["Properties"]
    assert "ModelName" not in model
    assert model["EnableNetworkIsolation"] is True
    assert model["PrimaryContainer"]["ModelDataUrl"] == MODEL_URL
    assert all("privateSubnet" in s["Fn::ImportValue"] for s in model["VpcConfig"]["Subnets"])
    env = model["PrimaryContainer"]["Environment"]
    assert env["SAGEMAKER_PROGRAM"] == "inference.py"
    assert env["SAGEMAKER_SUBMIT_DIRECTORY"] == "/opt/ml/model/code"
    assert env["DNNL_DEFAULT_FPMATH_MODE"] == "BF16"
    assert env["LRU_CACHE_CAPACITY"] == "1024" and env["THP_MEM_ALLOC_ENABLE"] == "1"
    # 16 vCPUs of ml.c7g.4xlarge: 2 kept for TorchServe's front end, 14 over 2 workers (sentiment/container.py).
    assert env["OMP_NUM_THREADS"] == "7"
    assert env["TS_DEFAULT_SERVICE_HANDLER"] == "sentiment_service:handle"  # 4xx for bad bytes, JSON errors
    groups = template.find_resources("AWS::EC2::SecurityGroup")
    assert all("SecurityGroupIngress" not in g["Properties"] for g in groups.values())


def test_endpoint_config_is_encrypted_and_unnamed(synthesized):
    config = _one(synthesized("prod-sentiment").template("sentiment"), "AWS::SageMaker::EndpointConfig")["Properties"]
    assert "EndpointConfigName" not in config
    assert "Fn::ImportValue" in config["KmsKeyId"]
    [variant] = config["ProductionVariants"]
    assert (variant["InstanceType"], variant["InitialInstanceCount"], variant["VariantName"]) == \
        ("ml.c7g.4xlarge", 2, "AllTraffic")
    assert variant["ModelName"]["Fn::GetAtt"][1] == "ModelName"


def test_endpoint_has_a_stable_name_and_rolls_back_on_alarms(synthesized):
    template = synthesized("prod-sentiment").template("sentiment")
    endpoint = _one(template, "AWS::SageMaker::Endpoint")["Properties"]
    assert endpoint["EndpointName"] == "prod-sentiment"
    policy = endpoint["DeploymentConfig"]["BlueGreenUpdatePolicy"]
    assert policy["TrafficRoutingConfiguration"]["Type"] == "CANARY"
    # 10% of two instances, counted in whole instances: one (at most half the fleet).
    assert policy["TrafficRoutingConfiguration"]["CanarySize"] == {"Type": "INSTANCE_COUNT", "Value": 1}
    # 30 min to provision the new fleet, then 10 min of canary bake and 10 min before the old fleet goes.
    assert policy["MaximumExecutionTimeoutInSeconds"] == 1800 + 600 + 600
    assert endpoint["RetainAllVariantProperties"] is True
    rollback = endpoint["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]
    alarms = template.find_resources("AWS::CloudWatch::Alarm")
    assert sorted(a["AlarmName"]["Ref"] for a in rollback) == sorted(alarms)
    metrics = {a["Properties"]["MetricName"]: a["Properties"] for a in alarms.values()}
    assert set(metrics) == {"Invocation5XXErrors", "ModelLatency"}
    assert metrics["ModelLatency"]["ExtendedStatistic"] == "p90"
    assert metrics["ModelLatency"]["Threshold"] == 1_000_000  # microseconds
    for alarm in metrics.values():
        assert {"Name": "EndpointName", "Value": "prod-sentiment"} in alarm["Dimensions"]
        assert "Fn::ImportValue" in alarm["AlarmActions"][0]


def test_variant_scales_on_invocations_per_instance(synthesized):
    template = synthesized("prod-sentiment").template("sentiment")
    template.has_resource_properties("AWS::ApplicationAutoScaling::ScalableTarget", {
        "ResourceId": "endpoint/prod-sentiment/variant/AllTraffic",
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "MinCapacity": 2, "MaxCapacity": 4,
    })
    target = _one(template, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint" in str(target["Properties"]["RoleARN"])
    template.has_resource_properties("AWS::ApplicationAutoScaling::ScalingPolicy", {
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": Match.object_like({
            "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
            "TargetValue": 600}),
    })


def test_execution_role_is_least_privilege(synthesized):
    template = synthesized("prod-sentiment").template("sentiment")
    # The endpoint's role; the other one is the log-group function's (tests/test_lifecycle.py checks it).
    (role_id,) = [key for key, role in template.find_resources("AWS::IAM::Role").items()
                  if "sagemaker.amazonaws.com" in str(role["Properties"]["AssumeRolePolicyDocument"])]
    assert "ManagedPolicyArns" not in template.find_resources("AWS::IAM::Role")[role_id]["Properties"]
    (policy,) = [policy for policy in template.find_resources("AWS::IAM::Policy").values()
                 if policy["Properties"]["Roles"] == [{"Ref": role_id}]]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    by_sid = {s["Sid"]: s for s in statements}
    assert by_sid["ReadModel"]["Resource"] == "arn:aws:s3:::example-bucket/models/sentiment/run-0001/model.tar.gz"
    assert by_sid["ReadModel"]["Action"] == "s3:GetObject"
    assert by_sid["PullImage"]["Resource"] == "arn:aws:ecr:us-west-2:763104351884:repository/pytorch-inference-arm64"
    assert by_sid["ReadRollbackAlarms"]["Action"] == "cloudwatch:DescribeAlarms"
    assert by_sid["DecryptModel"]["Action"] == "kms:Decrypt"
    assert {s["Sid"] for s in statements if s["Resource"] == "*"} == {
        "RegistryLogin", "PutMetrics", "ReadRollbackAlarms", "VpcAccess"}
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert not any(a == "*" or a.endswith(":*") for a in actions)


def test_outputs_name_the_endpoint_and_how_to_call_it(synthesized):
    outputs = synthesized("prod-sentiment").template("sentiment").to_json()["Outputs"]
    assert outputs["EndpointName"]["Value"] == "prod-sentiment"
    assert "python -m inference.sentiment.predict --endpoint prod-sentiment" in outputs["PredictCommand"]["Value"]


def test_image_table_covers_both_repository_names():
    assert graviton_image_uri("us-west-2", "2.4.0").endswith(
        "/pytorch-inference-graviton:2.4.0-cpu-py311-ubuntu22.04-sagemaker")
    assert set(GRAVITON_IMAGES) == {"2.4.0", "2.6.0"}


@pytest.mark.parametrize(("instance_type", "count"), [
    ("ml.c7g.large", 2), ("ml.c7g.xlarge", 4), ("ml.c7g.4xlarge", 16), ("ml.m6g.16xlarge", 64)])
def test_vcpus(instance_type, count):
    assert vcpus(instance_type) == count


def test_threads_split_vcpus_between_workers():
    config = load_settings("dev", {"sentiment.instance_type": "ml.c7g.2xlarge", "sentiment.workers": "4"}).sentiment
    assert container_environment(config, "us-west-2")["OMP_NUM_THREADS"] == "1"  # (8 - 1 front end) // 4


@pytest.mark.parametrize(("vcpu_count", "workers", "threads"), [
    (1, 1, 1), (2, 1, 2), (4, 1, 4), (4, 2, 2), (8, 1, 7), (16, 1, 14), (16, 2, 7), (64, 4, 14), (8, 8, 1),
])
def test_worker_threads_leave_the_front_end_a_core(vcpu_count, workers, threads):
    from inference.sentiment.container import front_end_vcpus, worker_threads

    assert worker_threads(vcpu_count, workers) == threads
    spare = vcpu_count - front_end_vcpus(vcpu_count)
    if workers <= spare:  # more workers than spare cores get one thread each, and share
        assert worker_threads(vcpu_count, workers) * workers <= spare


def test_a_non_graviton_instance_is_refused():
    config = load_settings("dev", {"sentiment.instance_type": "ml.c5.xlarge"}).sentiment
    with pytest.raises(SettingsError, match=r"sentiment.instance_type='ml.c5.xlarge': expected a Graviton"):
        check(config)
    check(load_settings("dev").sentiment)


def test_more_workers_than_vcpus_is_refused():
    config = load_settings("dev", {"sentiment.instance_type": "ml.c7g.large", "sentiment.workers": "4"}).sentiment
    with pytest.raises(SettingsError, match=r"sentiment.workers=4: expected at most the 2 vCPUs"):
        check(config)


def test_enabled_without_a_model_url_stops_synth():
    with pytest.raises(SettingsError, match=r"sentiment\.model_data_url"):
        load_settings("dev", {"sentiment.enabled": "true"})


def test_graviton_image_uris_agree_with_the_sagemaker_sdk_for_every_region_and_version_it_knows():
    """The SDK's offline tables, so a new region or a moved repository cannot drift past us silently."""
    from sagemaker.core import image_uris

    from stacks.images import DLC_ACCOUNTS

    versions = image_uris.config_for_framework("pytorch")["inference_graviton"]["versions"]
    shared = set(versions) & set(GRAVITON_IMAGES)
    assert shared == set(GRAVITON_IMAGES), "the SDK no longer knows a version we offer"
    for version in sorted(shared):
        sdk = versions[version]
        assert sdk["repository"] == GRAVITON_IMAGES[version][0]
        assert f"py{GRAVITON_IMAGES[version][2].replace('.', '')}" in sdk["py_versions"]
        for region, account in sdk["registries"].items():
            assert DLC_ACCOUNTS.get(region) == account, region
            assert graviton_image_uri(region, version).startswith(f"{account}.dkr.ecr.{region}.")
        for region in ("us-west-2", "af-south-1", "cn-north-1", "us-gov-west-1"):
            assert graviton_image_uri(region, version) == image_uris.retrieve(
                "pytorch", region=region, version=version, image_scope="inference_graviton",
                instance_type="ml.c7g.4xlarge")


def test_int8_quantization_is_a_setting_off_by_default():
    from settings import SettingsError

    config = load_settings("dev").sentiment
    assert container_environment(config, "us-west-2")["SENTIMENT_QUANTIZE"] == "none"
    config = load_settings("dev", {"sentiment.quantize": "int8"}).sentiment
    assert container_environment(config, "us-west-2")["SENTIMENT_QUANTIZE"] == "int8"
    with pytest.raises(SettingsError, match=r"sentiment\.quantize"):
        load_settings("dev", {"sentiment.quantize": "fp8"})
