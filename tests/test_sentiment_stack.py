"""The Graviton sentiment endpoint: our image, isolation, encryption, safe updates, scaling."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match

from settings import SettingsError, load_settings
from stacks.sentiment import (
    SERVING_IMAGE_CONTEXT,
    check,
    server_environment,
    vcpus,
)
from tests.conftest import REPO_ROOT

MODEL_URL = "s3://example-bucket/models/sentiment/run-0001/model.tar.gz"


def _one(template, kind: str) -> dict:
    found = template.find_resources(kind)
    assert len(found) == 1, f"{kind}: {list(found)}"
    return next(iter(found.values()))


def test_no_sentiment_stack_unless_enabled(synthesized):
    assert not any(name.endswith("-sentiment") for name in synthesized("prod").templates)


def test_model_is_unnamed_and_isolated_in_private_subnets(synthesized):
    template = synthesized("prod-sentiment").template("sentiment")
    model = _one(template, "AWS::SageMaker::Model")["Properties"]
    assert "ModelName" not in model
    assert model["EnableNetworkIsolation"] is True
    assert model["PrimaryContainer"]["ModelDataUrl"] == MODEL_URL
    assert all("privateSubnet" in s["Fn::ImportValue"] for s in model["VpcConfig"]["Subnets"])
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
    # /ping answers 200 only after the start-up calibration (issue 44): its budget (60 s) and 300 s for the rest.
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 360


def test_the_start_up_health_check_covers_the_calibration_budget_within_sagemakers_range():
    from stacks.sentiment import startup_health_check_timeout

    for seconds, expected in (("5", 305), ("600", 900), ("1800", 2100)):
        config = load_settings("prod", {"sentiment.calibration_seconds": seconds}).sentiment
        assert startup_health_check_timeout(config) == expected
        assert 60 <= expected <= 3600  # ProductionVariant's allowed range
    with pytest.raises(SettingsError, match=r"sentiment\.calibration_seconds"):
        load_settings("prod", {"sentiment.calibration_seconds": "3"})


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
    # Every endpoint alarm rolls back; the scan results' dead-letter alarm only notifies.
    undelivered = {name for name, alarm in alarms.items()
                   if alarm["Properties"].get("Namespace") == "AWS/SQS"}
    assert len(undelivered) == 1
    alarms = {name: alarm for name, alarm in alarms.items() if name not in undelivered}
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
    # Our image lives in the CDK bootstrap's container-assets repository of the endpoint's account and region.
    pull = json.dumps(by_sid["PullImage"]["Resource"])
    assert "arn:aws:ecr:us-west-2:" in pull and "cdk-hnb659fds-container-assets-${AWS::AccountId}-us-west-2" in pull
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


@pytest.mark.parametrize(("instance_type", "count"), [
    ("ml.c7g.large", 2), ("ml.c7g.xlarge", 4), ("ml.c7g.4xlarge", 16), ("ml.m6g.16xlarge", 64)])
def test_vcpus(instance_type, count):
    assert vcpus(instance_type) == count


def test_threads_split_vcpus_between_workers():
    config = load_settings("dev", {"sentiment.instance_type": "ml.c7g.2xlarge", "sentiment.workers": "4"}).sentiment
    assert server_environment(config)["OMP_NUM_THREADS"] == "1"  # (8 - 1 kept for the event loop) // 4


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


# --- our serving image -----------------------------------------------------------------------------------------

def test_default_runtime_is_our_arm64_image_built_by_the_app(synthesized):
    result = synthesized("prod-sentiment")
    model = _one(result.template("sentiment"), "AWS::SageMaker::Model")["Properties"]
    image = model["PrimaryContainer"]["Image"]["Fn::Sub"]
    assert "cdk-hnb659fds-container-assets-${AWS::AccountId}-us-west-2:" in image
    manifests = list(result.outdir.glob("*-sentiment.assets.json"))
    [docker] = json.loads(manifests[0].read_text())["dockerImages"].values()
    assert docker["source"]["platform"] == "linux/arm64"
    assert docker["source"]["dockerFile"] == "inference/sentiment/image/Dockerfile"
    assert image.endswith(":" + next(iter(docker["destinations"].values()))["imageTag"])
    # The build context carries the server package only (no venvs, node_modules or cdk.out).
    context = result.outdir / docker["source"]["directory"]
    files = {str(path.relative_to(context)) for path in context.rglob("*") if path.is_file()}
    assert "inference/sentiment/server/__main__.py" in files and "inference/sentiment/image/Dockerfile" in files
    outside = {name for name in files if not name.startswith("inference/")}
    # and the gate's held-out texts, for the calibration of archives that ship none (issue 44)
    assert outside == {"common/__init__.py", "common/library_warnings.py", "training/data/sample/validation.jsonl",
                       "training/data/sample/test.jsonl"}, sorted(outside)[:20]
    assert not any("__pycache__" in name or name.startswith("inference/llm/") for name in files)


def test_our_server_gets_workers_threads_batching_and_no_toolkit_settings(synthesized):
    model = _one(synthesized("prod-sentiment").template("sentiment"), "AWS::SageMaker::Model")["Properties"]
    env = model["PrimaryContainer"]["Environment"]
    # 16 vCPUs of ml.c7g.4xlarge, 2 workers: 2 kept for the event loop and tokenizer, 14 over 2 replicas
    # (inference/sentiment/container.py).
    assert env["SAGEMAKER_MODEL_SERVER_WORKERS"] == "2" and env["OMP_NUM_THREADS"] == "7"
    assert (env["MAX_BATCH"], env["SENTIMENT_MAX_BATCH_SIZE"], env["SENTIMENT_MAX_BATCH_WAIT_MS"],
            env["SENTIMENT_MAX_QUEUE"]) == ("64", "32", "5", "256")
    # Token budgets, deadline and drain (issue 32): the server's own defaults, passed explicitly.
    assert (env["SENTIMENT_MAX_BATCH_TOKENS"], env["SENTIMENT_MAX_QUEUE_TOKENS"], env["SENTIMENT_REQUEST_TIMEOUT_MS"],
            env["SENTIMENT_DRAIN_SECONDS"]) == ("2048", "16384", "20000", "22")
    assert env["SENTIMENT_CALIBRATION_SECONDS"] == "60"  # the start-up choice's budget
    assert "SENTIMENT_PRECISION" not in env  # unset: the start-up calibration chooses
    assert not any(key.startswith(("TS_", "SAGEMAKER_PROGRAM", "SAGEMAKER_SUBMIT")) for key in env)
    assert model["EnableNetworkIsolation"] is True  # the image installs nothing at start-up


def test_server_settings_reach_the_environment():
    config = load_settings("dev", {"sentiment.max_batch_size": "16", "sentiment.max_batch_wait_ms": "0",
                                   "sentiment.max_queue": "512", "sentiment.precision": "bf16",
                                   "sentiment.instance_type": "ml.c7g.2xlarge", "sentiment.workers": "1"}).sentiment
    env = server_environment(config)
    assert (env["SENTIMENT_MAX_BATCH_SIZE"], env["SENTIMENT_MAX_BATCH_WAIT_MS"], env["SENTIMENT_MAX_QUEUE"],
            env["SENTIMENT_PRECISION"], env["OMP_NUM_THREADS"]) == ("16", "0", "512", "bf16", "7")


@pytest.mark.parametrize(("overrides", "message"), [
    ({"sentiment.precision": "fp16"}, r"sentiment\.precision='fp16': expected one of fp32, bf16, int8"),
    ({"sentiment.max_batch_wait_ms": "5000"}, r"sentiment\.max_batch_wait_ms"),
    ({"sentiment.max_queue": "32"}, r"sentiment\.max_queue=32: expected at least sentiment\.max_batch \(64\)"),
    ({"sentiment.drain_seconds": "30"}, r"sentiment\.drain_seconds"),
    ({"sentiment.request_timeout_ms": "15000", "sentiment.drain_seconds": "10"},
     r"sentiment\.request_timeout_ms=15000: expected below sentiment\.drain_seconds \(10 s = 10000 ms\)"),
    ({"sentiment.max_queue_tokens": "1000"},
     r"sentiment\.max_queue_tokens=1000: expected at least sentiment\.max_batch_tokens \(2048\)"),
])
def test_bad_server_settings_are_refused_with_one_line(overrides, message):
    with pytest.raises(SettingsError, match=message):
        load_settings("dev", overrides)


def test_image_scanning_on_push_and_its_findings_reach_the_alarm_topic(synthesized):
    template = synthesized("prod-sentiment").template("sentiment")
    template.has_resource_properties("AWS::ECR::RegistryScanningConfiguration", {
        "ScanType": "BASIC",
        "Rules": [{"ScanFrequency": "SCAN_ON_PUSH",
                   "RepositoryFilters": [{"Filter": "cdk-*-container-assets-*", "FilterType": "WILDCARD"}]}]})
    rule = _one(template, "AWS::Events::Rule")["Properties"]
    assert rule["EventPattern"]["source"] == ["aws.ecr"] and rule["EventPattern"]["detail-type"] == ["ECR Image Scan"]
    image_tag = _one(template, "AWS::SageMaker::Model")["Properties"]["PrimaryContainer"]["Image"]["Fn::Sub"]
    assert rule["EventPattern"]["detail"]["image-tags"] == [image_tag.rsplit(":", 1)[1]]
    assert "Fn::ImportValue" in json.dumps(rule["Targets"][0]["Arn"])  # the environment's alarm topic
    outputs = template.to_json()["Outputs"]
    assert "describe-image-scan-findings" in json.dumps(outputs["ImageScanFindingsCommand"]["Value"])


def test_the_image_context_list_matches_the_dockerignore():
    from stacks.sentiment import REPO_ROOT, SERVING_DOCKERFILE

    ignore = (REPO_ROOT / f"{SERVING_DOCKERFILE}.dockerignore").read_text().splitlines()
    assert [line for line in ignore if line and not line.startswith("#")] == SERVING_IMAGE_CONTEXT


def test_scan_findings_rule_has_an_encrypted_ssl_only_dead_letter_queue(synthesized):
    """Issue 34: EventBridge keeps what it cannot deliver to the alarm topic (Serverless-EventBusDLQ)."""
    template = synthesized("prod-sentiment").template("sentiment")
    rule = next(iter(template.find_resources("AWS::Events::Rule", {"Properties": {
        "EventPattern": {"source": ["aws.ecr"]}}}).values()))
    target = rule["Properties"]["Targets"][0]
    queue_id = target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0]
    queue = template.to_json()["Resources"][queue_id]
    assert "KmsMasterKeyId" in queue["Properties"]  # the environment's key, not SQS-managed
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 4
    policies = template.find_resources("AWS::SQS::QueuePolicy")
    statements = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]
                  if {"Ref": queue_id} in p["Properties"]["Queues"]]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in statements)
    assert any(s.get("Principal") == {"Service": "events.amazonaws.com"} for s in statements)


def test_endpoint_log_group_lambda_is_traced(synthesized):
    template = synthesized("prod-sentiment").template("sentiment")
    functions = template.find_resources("AWS::Lambda::Function")
    assert functions and all(f["Properties"]["TracingConfig"] == {"Mode": "Active"} for f in functions.values())


# --- the image SageMaker accepts (issue 32): one Docker v2 schema 2 manifest, no attestations ------------------------

CDK_CLI = REPO_ROOT / "node_modules" / "aws-cdk"


def _cdk_assets_docker_code() -> tuple[str, str]:
    """(Docker.build, the image publisher's buildImage) from the pinned CDK CLI's bundled cdk-assets: what runs
    `docker build` for `cdk deploy`, read in the release package.json pins."""
    pinned = json.loads((REPO_ROOT / "package.json").read_text())["devDependencies"]["aws-cdk"]
    installed = json.loads((CDK_CLI / "package.json").read_text())["version"]
    assert installed == pinned, f"node_modules has aws-cdk {installed}, package.json pins {pinned}: run npm ci"
    source = (CDK_CLI / "lib" / "index.js").read_text()
    build = source[source.index("async build(options) {"):source.index("async login(ecr) {")]
    image = source[source.index("async buildImage(localTagName) {"):source.index("async isImageCached(")]
    return build, image


def test_the_asset_manifest_asks_for_one_arm64_docker_manifest_without_attestations(synthesized):
    """SageMaker's CreateModel has refused OCI image indexes (FACTS.md, "SageMaker's hosting contract for our own
    image"); buildx makes one from a multi-platform build, a provenance attestation, or a push with OCI media types."""
    result = synthesized("prod-sentiment")
    [manifest] = result.outdir.glob("*-sentiment.assets.json")
    [docker] = json.loads(manifest.read_text())["dockerImages"].values()
    source = docker["source"]
    assert source["platform"] == "linux/arm64"  # one platform: no index for several
    assert source["dockerOutputs"] == ["type=docker,oci-mediatypes=false"]  # the local store, Docker media types
    build, image = _cdk_assets_docker_code()
    # Every field the manifest sets reaches `docker build` (none is silently dropped) ...
    fields = {"directory": "directory: fullPath", "dockerFile": "file: source.dockerFile",
              "platform": "platform: source.platform", "dockerOutputs": "outputs: source.dockerOutputs"}
    assert set(source) <= set(fields), sorted(source)
    assert all(fields[name] in image for name in source)
    assert '...options.platform ? ["--platform", options.platform] : []' in build
    assert "...options.outputs ? options.outputs.map((output) => [`--output=${output}`]) : []" in build
    # ... and cdk-assets turns buildx's default provenance attestation off for that command.
    assert 'env: {\n            BUILDX_NO_DEFAULT_ATTESTATIONS: "1"' in build
    assert "--provenance" not in build and "--attest" not in build and "--sbom" not in build


def test_the_pipelines_asset_builds_turn_attestations_off_too(synthesized):
    """The pipeline publishes with the cdk-assets release package.json pins (tests/test_pipeline_publishing.py), whose
    `docker build` inherits the CodeBuild project's environment."""
    from aws_cdk.assertions import Template

    template = Template.from_json(synthesized("pipeline-sentiment").templates["mlrecipes-pipeline"])
    projects = template.find_resources("AWS::CodeBuild::Project")
    publishers = {name: project for name, project in projects.items()
                  if "cdk-assets" in project["Properties"]["Source"]["BuildSpec"]}
    assert publishers
    for project in publishers.values():
        variables = project["Properties"]["Environment"]["EnvironmentVariables"]
        assert {"Name": "BUILDX_NO_DEFAULT_ATTESTATIONS", "Type": "PLAINTEXT", "Value": "1"} in variables
