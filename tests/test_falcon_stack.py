"""The Falcon endpoint stack: what the template promises, read off two synthesized configurations (cdk-nag on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from aws_cdk.assertions import Match

from settings import SettingsError, load_settings
from tests.conftest import REPO_ROOT, read_templates, synthesize

HUB = {"falcon.enabled": "true"}
# Weights from S3, the recipe's container with continuous batching unpaged, and autoscaling.
# 0.23.0 is past its (derived) end of patch: the recipe's image deploys only with allow_unpatched_images.
S3 = {"falcon.enabled": "true", "falcon.model_s3_uri": "s3://models-bucket/falcon-40b/", "falcon.lmi_version": "0.23.0",
      "allow_unpatched_images": "true", "falcon.batching": "rolling", "falcon.max_instances": "3",
      "account": "123456789012", "region": "eu-central-2"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("falcon-hub"), "prod", HUB)


@pytest.fixture(scope="module")
def from_s3(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("falcon-s3"), "prod", S3)


def only(template, kind: str) -> dict:
    (resource,) = template.find_resources(kind).values()
    return resource["Properties"]


def policy_statements(template) -> dict[str, dict]:
    (policy,) = [p for p in template.find_resources("AWS::IAM::Policy").values()
                 if "ExecutionRole" in json.dumps(p["Properties"]["Roles"])]
    return {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}


def test_model_gets_the_default_configuration_as_environment(hub):
    """LMI 0.36.0-lmi27, the default (vLLM only, engine Python), continuous batching with paging, the recipe's TP 8
    fp16, batch 32 and prefill 1024; vLLM's context = input + output tokens (FACTS: LMI configuration, 0.33+)."""
    template = hub.template("falcon")
    container = only(template, "AWS::SageMaker::Model")["PrimaryContainer"]
    assert container["Environment"] == {
        "OPTION_ENGINE": "Python", "HF_MODEL_ID": "tiiuae/falcon-40b", "OPTION_TENSOR_PARALLEL_DEGREE": "8",
        "OPTION_DTYPE": "fp16", "OPTION_TRUST_REMOTE_CODE": "false", "OPTION_MODEL_LOADING_TIMEOUT": "1800",
        "OPTION_ENTRYPOINT": "djl_python.lmi_vllm.vllm_async_service", "OPTION_ASYNC_MODE": "true",
        "OPTION_ROLLING_BATCH": "vllm", "OPTION_MAX_ROLLING_BATCH_SIZE": "32",
        "OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS": "1024", "OPTION_MAX_MODEL_LEN": "1280",
        "OPTION_GPU_MEMORY_UTILIZATION": "0.9", "OPTION_ENABLE_CHUNKED_PREFILL": "true"}
    # The container registers the hub model from HF_MODEL_ID and serves it with vLLM's async service.
    assert container["Environment"]["HF_MODEL_ID"] == "tiiuae/falcon-40b"
    assert container["Environment"]["OPTION_ENTRYPOINT"] == "djl_python.lmi_vllm.vllm_async_service"
    assert container["Image"] == "763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.36.0-lmi27.0.0-cu130"
    assert "ModelDataSource" not in container


def test_model_runs_in_the_private_subnets_and_downloads_from_the_hub(hub):
    model = only(hub.template("falcon"), "AWS::SageMaker::Model")
    assert model["EnableNetworkIsolation"] is False  # the container fetches the weights itself
    subnets = model["VpcConfig"]["Subnets"]
    assert len(subnets) == 2 and all("privateSubnet" in s["Fn::ImportValue"] for s in subnets)
    (group,) = model["VpcConfig"]["SecurityGroupIds"]
    assert group["Fn::GetAtt"][1] == "GroupId"


def test_only_hub_mode_runs_without_network_isolation_and_says_why(hub, from_s3):
    """checkov CKV_AWS_370 (SageMaker model without network isolation) is acknowledged in hub mode only, with the
    production path in its reason; from S3 the model is isolated and needs no acknowledgement."""
    (hub_model,) = hub.template("falcon").find_resources("AWS::SageMaker::Model").values()
    (skip,) = hub_model["Metadata"]["checkov"]["skip"]
    assert skip["id"] == "CKV_AWS_370" and "inference.llm.lmi stage" in skip["comment"]
    (s3_model,) = from_s3.template("falcon").find_resources("AWS::SageMaker::Model").values()
    assert s3_model["Properties"]["EnableNetworkIsolation"] is True
    assert "checkov" not in s3_model.get("Metadata", {})


def test_model_waits_for_the_role_policy_that_lets_it_pull(hub):
    template = hub.template("falcon")
    (policy_id,) = [key for key, policy in template.find_resources("AWS::IAM::Policy").items()
                    if "ExecutionRole" in json.dumps(policy["Properties"]["Roles"])]
    (model,) = template.find_resources("AWS::SageMaker::Model").values()
    assert model["DependsOn"] == [policy_id]


def test_security_group_has_no_inbound_and_https_out(hub, from_s3):
    hub_group = only(hub.template("falcon"), "AWS::EC2::SecurityGroup")
    assert "SecurityGroupIngress" not in hub_group
    assert [(r["CidrIp"], r["FromPort"], r["ToPort"]) for r in hub_group["SecurityGroupEgress"]] == \
        [("0.0.0.0/0", 443, 443)]
    s3_group = only(from_s3.template("falcon"), "AWS::EC2::SecurityGroup")
    assert [r["CidrIp"] for r in s3_group["SecurityGroupEgress"]] == ["10.40.0.0/16"]


def test_only_the_endpoint_has_a_physical_name(hub):
    template = hub.template("falcon")
    assert "ModelName" not in only(template, "AWS::SageMaker::Model")
    assert "EndpointConfigName" not in only(template, "AWS::SageMaker::EndpointConfig")
    assert only(template, "AWS::SageMaker::Endpoint")["EndpointName"] == "prod-falcon"
    assert not [role for role in template.find_resources("AWS::IAM::Role").values() if "RoleName" in role["Properties"]]


def test_endpoint_config_sets_instance_and_timeouts_and_no_key_on_nvme(hub):
    config = only(hub.template("falcon"), "AWS::SageMaker::EndpointConfig")
    (variant,) = config["ProductionVariants"]
    assert variant == {
        "VariantName": "AllTraffic", "ModelName": {"Fn::GetAtt": ["Model", "ModelName"]},
        "InstanceType": "ml.g5.48xlarge", "InitialInstanceCount": 1, "InitialVariantWeight": 1,
        "ContainerStartupHealthCheckTimeoutInSeconds": 3600, "ModelDataDownloadTimeoutInSeconds": 3600,
    }
    # g5 has local NVMe: SageMaker rejects KmsKeyId and VolumeSizeInGB for it.
    assert "KmsKeyId" not in config


def test_alarms_on_server_errors_and_p90_latency_notify_the_topic(hub):
    template = hub.template("falcon")
    topic = {"Fn::ImportValue": Match.string_like_regexp("artifacts:.*Alarms")}
    dimensions = [{"Name": "EndpointName", "Value": "prod-falcon"}, {"Name": "VariantName", "Value": "AllTraffic"}]
    template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "Namespace": "AWS/SageMaker", "MetricName": "Invocation5XXErrors", "Statistic": "Sum",
        "Dimensions": dimensions, "AlarmActions": [topic]})
    template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "Namespace": "AWS/SageMaker", "MetricName": "ModelLatency", "ExtendedStatistic": "p90",
        "Threshold": 45_000_000, "Dimensions": dimensions, "AlarmActions": [topic]})


def test_no_autoscaling_when_min_equals_max(hub):
    hub.template("falcon").resource_count_is("AWS::ApplicationAutoScaling::ScalableTarget", 0)


def test_role_pulls_the_lmi_image_and_writes_its_own_logs_only(hub):
    template = hub.template("falcon")
    (role,) = [role["Properties"] for key, role in template.find_resources("AWS::IAM::Role").items()
               if key.startswith("ExecutionRole")]
    assert role["AssumeRolePolicyDocument"]["Statement"] == [
        {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}}]
    assert "ManagedPolicyArns" not in role
    statements = policy_statements(template)
    assert sorted(statements) == ["EndpointLogs", "PullLmiImage", "RegistryLogin", "VpcNetworkInterfaces"]
    assert statements["PullLmiImage"]["Resource"] == "arn:aws:ecr:us-west-2:763104351884:repository/djl-inference"
    assert "prod-falcon" in json.dumps(statements["EndpointLogs"]["Resource"])
    assert "ec2:CreateNetworkInterface" in statements["VpcNetworkInterfaces"]["Action"]
    assert not any(a.startswith(("s3:", "kms:")) for s in statements.values() for a in json.dumps(s["Action"]))


def test_outputs_name_the_endpoint_an_invoke_command_and_the_log_group(hub):
    template = hub.template("falcon")
    (endpoint_id,) = template.find_resources("AWS::SageMaker::Endpoint")
    assert template.to_json()["Outputs"]["EndpointName"]["Value"] == {"Fn::GetAtt": [endpoint_id, "EndpointName"]}
    assert only(template, "AWS::SageMaker::Endpoint")["EndpointName"] == "prod-falcon"
    template.has_output("InvokeCommand", {"Value": Match.string_like_regexp(
        "invoke-endpoint .*--endpoint-name prod-falcon .*max_new_tokens")})
    template.has_output("LogGroupName", {"Value": "/aws/sagemaker/Endpoints/prod-falcon"})
    # vLLM (0.33) streams when the body says "stream": true.
    template.has_output("InvokeStreamCommand", {"Value": Match.string_like_regexp(
        "invoke-endpoint-with-response-stream .*--endpoint-name prod-falcon .*\"stream\": true")})



def test_weights_from_s3_are_attached_uncompressed_and_the_model_is_isolated(from_s3):
    template = from_s3.template("falcon")
    model = only(template, "AWS::SageMaker::Model")
    assert model["EnableNetworkIsolation"] is True
    container = model["PrimaryContainer"]
    assert container["ModelDataSource"] == {"S3DataSource": {
        "S3Uri": "s3://models-bucket/falcon-40b/", "S3DataType": "S3Prefix", "CompressionType": "None"}}
    assert container["Environment"]["OPTION_MODEL_ID"] == "/opt/ml/model"
    assert "HF_MODEL_ID" not in container["Environment"]
    # 0.23: lmi-dist under MPI (OPTION_ENGINE means nothing there), PagedAttention off.
    assert container["Environment"]["OPTION_MPI_MODE"] == "true"
    assert container["Environment"]["OPTION_ROLLING_BATCH"] == "lmi-dist"
    assert container["Environment"]["OPTION_PAGED_ATTENTION"] == "false"
    assert container["Image"] == \
        "380420809688.dkr.ecr.eu-central-2.amazonaws.com/djl-inference:0.23.0-deepspeed0.9.5-cu118"


def test_role_reads_exactly_the_weights_prefix(from_s3):
    statements = policy_statements(from_s3.template("falcon"))
    assert statements["ReadWeights"]["Resource"] == "arn:aws:s3:::models-bucket/falcon-40b/*"
    assert statements["ListWeights"]["Condition"] == {"StringLike": {"s3:prefix": ["falcon-40b/*"]}}
    assert statements["DecryptWeights"]["Condition"] == {
        "StringEquals": {"kms:ViaService": "s3.eu-central-2.amazonaws.com"}}
    assert statements["EndpointLogs"]["Resource"][1] == \
        "arn:aws:logs:eu-central-2:123456789012:log-group:/aws/sagemaker/Endpoints/prod-falcon:log-stream:*"


def test_autoscaling_tracks_invocations_per_instance(from_s3):
    template = from_s3.template("falcon")
    template.has_resource("AWS::ApplicationAutoScaling::ScalableTarget", {
        "Properties": {"ServiceNamespace": "sagemaker", "ResourceId": "endpoint/prod-falcon/variant/AllTraffic",
                       "ScalableDimension": "sagemaker:variant:DesiredInstanceCount", "MinCapacity": 1,
                       "MaxCapacity": 3},
        "DependsOn": ["Endpoint"]})
    assert "RoleARN" not in only(template, "AWS::ApplicationAutoScaling::ScalableTarget")
    template.has_resource_properties("AWS::ApplicationAutoScaling::ScalingPolicy", {
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": Match.object_like({
            "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}})})


def test_templates_pass_cfn_lint(hub, from_s3):
    files = [str(s.outdir / "mlrecipes-prod-falcon.template.json") for s in (hub, from_s3)]
    # cfn-lint has no __main__ module: run its console entry point. Exit 0 means no error, warning or note.
    runner = "import sys; from cfnlint.runner import main; sys.exit(main())"
    result = subprocess.run([sys.executable, "-c", runner, *files], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_a_bad_combination_stops_the_stack_before_any_resource(capsys):
    from stacks.environment import build_environment, new_app

    settings = load_settings("prod", {"falcon.enabled": "true", "falcon.instance_type": "ml.g5.24xlarge"})
    app = new_app()
    with pytest.raises(SettingsError, match=r"at most 4, the GPU count of one ml\.g5\.24xlarge"):
        build_environment(app, settings)
    assert app.node.try_find_child("mlrecipes-prod-falcon") is None


def test_synth_prints_the_sizing_report(capsys):
    from stacks.environment import build_environment, new_app

    build_environment(new_app(), load_settings("prod", HUB))
    err = capsys.readouterr().err
    assert "falcon sizing (prod):" in err and "9.7 GiB per GPU" in err and "largest batch" in err


def test_app_exits_1_with_one_line_for_a_combination_that_cannot_run(tmp_path):
    context = {"falcon.enabled": "true", "falcon.instance_type": "ml.g5.2xlarge"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
    env.update(JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20", CDK_CONTEXT_JSON=json.dumps(context),
               CDK_OUTDIR=str(tmp_path), AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null",
               AWS_EC2_METADATA_DISABLED="true")
    result = subprocess.run([sys.executable, "app.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "error: invalid setting falcon.tensor_parallel_degree=8: expected at most 1, the GPU count of one "
        "ml.g5.2xlarge"]
    assert not (tmp_path / "manifest.json").exists()


# The recipe's table (FACTS: "Recipe 2"), written out: common keys, then each stage's batching keys, as the
# container reads them from the environment. LMI 0.23 takes MPI from OPTION_MPI_MODE and reads rolling batch keys;
# `auto` would not pick lmi-dist for FalconForCausalLM there, so lmi-dist is named (FACTS: LMI configuration).
RECIPE_COMMON = {"HF_MODEL_ID": "tiiuae/falcon-40b", "OPTION_TENSOR_PARALLEL_DEGREE": "8", "OPTION_DTYPE": "fp16",
                 "OPTION_TRUST_REMOTE_CODE": "true", "OPTION_MODEL_LOADING_TIMEOUT": "1800"}
RECIPE_ROLLING = {"OPTION_MPI_MODE": "true", "OPTION_ROLLING_BATCH": "lmi-dist", "OPTION_MAX_ROLLING_BATCH_SIZE": "32",
                  "OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS": "1024"}
EXPECTED_ENVIRONMENTS = {
    "v0230-dynamic": {**RECIPE_COMMON, "OPTION_DEVICE_MAP": "auto", "SERVING_BATCH_SIZE": "4",
                      "SERVING_MAX_BATCH_DELAY": "100"},
    "v0230-rolling": {**RECIPE_COMMON, **RECIPE_ROLLING, "OPTION_PAGED_ATTENTION": "false"},
    "v0230-rolling-paged": {**RECIPE_COMMON, **RECIPE_ROLLING, "OPTION_PAGED_ATTENTION": "true"},
    # 0.33: engine Python, the HF handler with dynamic batching (rolling batch off, layers placed by accelerate) ...
    "v0330-dynamic": {"OPTION_ENGINE": "Python", **RECIPE_COMMON, "OPTION_TRUST_REMOTE_CODE": "false",
                      "OPTION_ENTRYPOINT": "djl_python.huggingface", "OPTION_ROLLING_BATCH": "disable",
                      "OPTION_DEVICE_MAP": "auto", "SERVING_BATCH_SIZE": "4", "SERVING_MAX_BATCH_DELAY": "100"},
    # ... or vLLM, which pages always (lmi-dist requests are rewritten to vllm from lmi15).
    "v0330-rolling-paged": {"OPTION_ENGINE": "Python", **RECIPE_COMMON, "OPTION_TRUST_REMOTE_CODE": "false",
                            "OPTION_ENTRYPOINT": "djl_python.lmi_vllm.vllm_async_service", "OPTION_ASYNC_MODE": "true",
                            "OPTION_ROLLING_BATCH": "vllm", "OPTION_MAX_ROLLING_BATCH_SIZE": "32",
                            "OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS": "1024", "OPTION_MAX_MODEL_LEN": "1280",
                            "OPTION_GPU_MEMORY_UTILIZATION": "0.9", "OPTION_ENABLE_CHUNKED_PREFILL": "true"},
}


@pytest.mark.slow
def test_the_recipes_three_configurations_synthesize_on_its_container_and_the_default_one(tmp_path):
    """dynamic (TP 8, batch 4, delay 100), rolling lmi-dist, rolling + PagedAttention; fp16, prefill 1024, batch
    32 on LMI 0.23.0, and dynamic / rolling_paged on the default container (which has no unpaged rolling batch).
    One app, one stage per configuration, cdk-nag on; each model's environment is the literal one above."""
    import aws_cdk as cdk

    from stacks.environment import build_environment, new_app
    from stacks.nag import add_checks

    configurations = [("0.23.0", "dynamic"), ("0.23.0", "rolling"), ("0.23.0", "rolling_paged"),
                      ("0.33.0", "dynamic"), ("0.33.0", "rolling_paged")]
    app = new_app(outdir=str(tmp_path))
    for version, batching in configurations:
        settings = load_settings("prod", {**HUB, "falcon.lmi_version": version, "falcon.batching": batching,
                                          "allow_unpatched_images": True})  # both are past their end of patch
        stage = cdk.Stage(app, f"v{version.replace('.', '')}-{batching.replace('_', '-')}")
        build_environment(stage, settings)
    add_checks(app)
    app.synth()
    templates = read_templates(tmp_path)
    for stage_name, environment in EXPECTED_ENVIRONMENTS.items():
        (template,) = [t for name, t in templates.items() if name.startswith(stage_name + "/") and "falcon" in name]
        (model,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::SageMaker::Model"]
        assert model["Properties"]["PrimaryContainer"]["Environment"] == environment, stage_name


def test_an_autoscaled_endpoint_keeps_its_instance_count_across_updates(hub, from_s3):
    """UpdateEndpoint resets the fleet to the new config's initial count unless RetainAllVariantProperties is set."""
    assert only(from_s3.template("falcon"), "AWS::SageMaker::Endpoint")["RetainAllVariantProperties"] is True
    # One fixed instance: nothing to keep, and a smaller fleet than configured never survives an update.
    assert "RetainAllVariantProperties" not in only(hub.template("falcon"), "AWS::SageMaker::Endpoint")


def test_a_gated_models_token_is_a_deploy_time_reference_never_a_value(tmp_path):
    """falcon.hf_token_secret: HF_TOKEN is a Secrets Manager dynamic reference, resolved by CloudFormation when it
    creates the model; the synthesized assembly holds the secret's name only, in that one place."""
    overrides = {**HUB, "falcon.hf_token_secret": "prod/hf-token", "falcon.model_id": "Qwen/Qwen3-8B",
                 "falcon.dtype": "bf16"}
    app = synthesize(tmp_path, "prod", overrides)
    template = app.template("falcon")
    environment = only(template, "AWS::SageMaker::Model")["PrimaryContainer"]["Environment"]
    assert environment == {
        "HF_TOKEN": "{{resolve:secretsmanager:prod/hf-token:SecretString:::}}",
        "OPTION_ENGINE": "Python", "HF_MODEL_ID": "Qwen/Qwen3-8B", "OPTION_TENSOR_PARALLEL_DEGREE": "8",
        "OPTION_DTYPE": "bf16", "OPTION_TRUST_REMOTE_CODE": "false", "OPTION_MODEL_LOADING_TIMEOUT": "1800",
        "OPTION_ENTRYPOINT": "djl_python.lmi_vllm.vllm_async_service", "OPTION_ASYNC_MODE": "true",
        "OPTION_ROLLING_BATCH": "vllm", "OPTION_MAX_ROLLING_BATCH_SIZE": "32",
        "OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS": "1024", "OPTION_MAX_MODEL_LEN": "1280",
        "OPTION_GPU_MEMORY_UTILIZATION": "0.9", "OPTION_ENABLE_CHUNKED_PREFILL": "true"}
    # Everywhere in the assembly (templates, tree.json, manifests) the secret appears only as that reference.
    assembly = "".join(path.read_text(errors="replace") for path in tmp_path.rglob("*") if path.is_file())
    reference = "{{resolve:secretsmanager:prod/hf-token:SecretString:::}}"
    assert assembly.count("prod/hf-token") == assembly.count(reference) >= 1
    assert assembly.count('"HF_TOKEN"') == assembly.count(f'"HF_TOKEN":"{reference}"') + assembly.count(
        f'"HF_TOKEN": "{reference}"')
