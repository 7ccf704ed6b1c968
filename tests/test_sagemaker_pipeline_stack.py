"""training.backend=sagemaker: the synthesized pipeline, and every API request in it checked against botocore.

Each step's `Arguments` is the request SageMaker sends for it (Training -> CreateTrainingJob with a generated
TrainingJobName, RegisterModel -> CreateModelPackage). The test replaces CloudFormation tokens and pipeline
expressions by plausible values and validates the result with botocore's ParamValidator (required members,
types) plus the constraints botocore's validator leaves out (enums, min/max, patterns) from the same model.
"""

from __future__ import annotations

import json
import re

import pytest
from botocore.validate import ParamValidator

from settings import settings_from_context
from stacks import sagemaker_training
from stacks.instances import has_instance_storage
from stacks.sagemaker_training import GATE_METRIC
from stacks.sentiment import serving_image_tag
from tests import botocore_rules

ACCOUNT = "123456789012"
EXECUTION_ID = "a1b2c3d4e5f6"
MODEL_URL = f"s3://example-bucket/models/sentiment-sagemaker/jobs/pipelines-{EXECUTION_ID}-Train/output/model.tar.gz"
STEP_OPERATIONS = {"Training": "CreateTrainingJob", "RegisterModel": "CreateModelPackage"}
# What the training job's final metrics would be: a different value for each metric its MetricDefinitions name, so
# a step that reads the wrong metric shows it. A metric the job does not define has no value (the stand-in fails).
FINAL_METRICS = {"validation:accuracy": 0.8104, "validation:recall_macro": 0.7123, "validation:f1_macro": 0.7391,
                 "test:accuracy": 0.7957, "test:recall_macro": 0.6988, "test:f1_macro": 0.7215,
                 "eval:recall_macro": 0.7045, "train:loss": 0.5231}


@pytest.fixture(scope="module")
def template(synthesized):
    return synthesized("dev-sagemaker").template("sagemaker-training")


@pytest.fixture(scope="module")
def definition(template) -> dict:
    pipeline = next(iter(template.find_resources("AWS::SageMaker::Pipeline").values()))
    body = pipeline["Properties"]["PipelineDefinition"]["PipelineDefinitionBody"]
    return json.loads(_render(body))


@pytest.fixture(scope="module")
def sagemaker_model():
    return botocore_rules.sagemaker_model()


def _render(value) -> str:
    """The definition text with each CloudFormation token replaced by a value of the kind it resolves to."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_render(part) for part in parts)
    if "Fn::Sub" in value:
        return value["Fn::Sub"].replace("${AWS::AccountId}", ACCOUNT).replace("${AWS::Partition}", "aws")
    if "Fn::GetAtt" in value:
        logical_id, attribute = value["Fn::GetAtt"]
        if attribute == "Arn" and "Role" in logical_id:
            return f"arn:aws:iam::{ACCOUNT}:role/{logical_id}"
        if attribute == "GroupId":
            return "sg-0123456789abcdef0"
    if "Fn::ImportValue" in value:
        name = value["Fn::ImportValue"]
        if "Subnet" in name:
            return "subnet-0123456789abcdef0"
        if "Key" in name:
            return f"arn:aws:kms:us-west-2:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
        if "Artifacts" in name:
            return "example-bucket"
    if value.get("Ref") == "AWS::AccountId":
        return ACCOUNT
    if value.get("Ref") == "AWS::URLSuffix":
        return "amazonaws.com"
    raise AssertionError(f"no stand-in for token {value}")


def _evaluate(value):
    """Pipeline expressions ({"Get": ...}, {"Std:Join": ...}) as SageMaker evaluates them at run time."""
    if isinstance(value, list):
        return [_evaluate(item) for item in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Get"}:
        path = value["Get"]
        if path == "Execution.PipelineExecutionId":
            return EXECUTION_ID
        if path == "Steps.Train.ModelArtifacts.S3ModelArtifacts":
            return MODEL_URL
        if path == "Steps.Train.TrainingJobName":
            return f"pipelines-{EXECUTION_ID}-Train-x1y2z3"
        metric = re.fullmatch(r"Steps\.Train\.FinalMetricDataList\['([\w:]+)'\]\.Value", path)
        if metric and metric.group(1) in FINAL_METRICS:
            return FINAL_METRICS[metric.group(1)]
        raise AssertionError(f"unknown property reference {path}")
    if set(value) == {"Std:Join"}:
        join = value["Std:Join"]
        return join["On"].join(str(_evaluate(item)) for item in join["Values"])
    return {key: _evaluate(item) for key, item in value.items()}


def _steps(definition) -> list[dict]:
    found = []
    for step in definition["Steps"]:
        found.append(step)
        if step["Type"] == "Condition":
            found += step["Arguments"]["IfSteps"] + step["Arguments"]["ElseSteps"]
    return found


def _request(step: dict) -> dict:
    request = _evaluate(step["Arguments"])
    if step["Type"] == "Training":
        request["TrainingJobName"] = f"pipelines-{EXECUTION_ID}-Train-x1y2z3"
    return request


# --- botocore validation ------------------------------------------------------------------------------

def test_every_step_request_is_valid_for_the_sagemaker_api(definition, sagemaker_model):
    steps = _steps(definition)
    assert [s["Type"] for s in steps] == ["Training", "Condition", "RegisterModel", "Fail"]
    validated = 0
    for step in steps:
        operation = STEP_OPERATIONS.get(step["Type"])
        if operation is None:
            continue
        shape = sagemaker_model.operation_model(operation).input_shape
        request = _request(step)
        report = ParamValidator().validate(request, shape)
        assert not report.has_errors(), f"{step['Name']} -> {operation}: {report.generate_report()}"
        assert botocore_rules.constraint_errors(request, shape) == [], f"{step['Name']} -> {operation}"
        validated += 1
    assert validated == 2


def test_the_validation_catches_a_bad_request(definition, sagemaker_model):
    """The check above can fail: a wrong enum, a missing required member, a number out of range."""
    shape = sagemaker_model.operation_model("CreateTrainingJob").input_shape
    request = _request(definition["Steps"][0])
    request["AlgorithmSpecification"]["TrainingInputMode"] = "Streaming"
    request["StoppingCondition"]["MaxRuntimeInSeconds"] = 0
    del request["RoleArn"]
    assert "RoleArn" in ParamValidator().validate(request, shape).generate_report()
    errors = botocore_rules.constraint_errors(request, shape)
    assert any("TrainingInputMode" in e for e in errors) and any("MaxRuntimeInSeconds" in e for e in errors)


def test_the_validation_reads_the_models_java_patterns(definition, sagemaker_model):
    """Patterns with \\p{...} classes (metadata keys and values among them) are checked too, not dropped."""
    shape = sagemaker_model.operation_model("CreateModelPackage").input_shape
    register = _request(definition["Steps"][1]["Arguments"]["IfSteps"][0])
    key_pattern = shape.members["CustomerMetadataProperties"].key.metadata["pattern"]
    assert "\\p{L}" in key_pattern
    register["CustomerMetadataProperties"]["recall#macro"] = "0.7"
    errors = botocore_rules.constraint_errors(register, shape)
    assert errors == [f".CustomerMetadataProperties key: 'recall#macro' does not match {key_pattern}"]


def test_a_pattern_nothing_compiles_fails_instead_of_passing_unchecked():
    surrogates = botocore_rules.shape("Database").metadata["pattern"]  # Java's UTF-16 surrogate ranges
    with pytest.raises(AssertionError, match="does not compile"):
        botocore_rules.constraint_errors("sales", botocore_rules.shape("Database"))
    assert "\\uD800" in surrogates


def test_pipeline_definition_fits_the_create_pipeline_limits(template, definition, sagemaker_model):
    members = sagemaker_model.operation_model("CreatePipeline").input_shape.members
    text = json.dumps(definition)
    assert len(text) <= members["PipelineDefinition"].metadata["max"]
    props = next(iter(template.find_resources("AWS::SageMaker::Pipeline").values()))["Properties"]
    assert re.fullmatch(members["PipelineName"].metadata["pattern"], props["PipelineName"])
    assert props["PipelineName"] == "mlrecipes-dev-sentiment-training"


# --- what the training step asks for ------------------------------------------------------------------

def test_training_runs_two_spot_instances_in_private_subnets_encrypted(definition):
    train = _request(definition["Steps"][0])
    assert train["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
    assert train["ResourceConfig"]["InstanceCount"] == 2
    # p4d's NVMe is hardware-encrypted; SageMaker refuses a VolumeKmsKeyId for it.
    assert "VolumeKmsKeyId" not in train["ResourceConfig"]
    assert train["OutputDataConfig"]["KmsKeyId"].startswith("arn:aws:kms:")
    assert train["EnableInterContainerTrafficEncryption"] is True
    assert train["VpcConfig"] == {"SecurityGroupIds": ["sg-0123456789abcdef0"],
                                  "Subnets": ["subnet-0123456789abcdef0"] * 2}
    assert train["EnableManagedSpotTraining"] is True
    assert train["StoppingCondition"] == {"MaxRuntimeInSeconds": 6 * 3600, "MaxWaitTimeInSeconds": 12 * 3600}
    assert train["CheckpointConfig"] == {
        "S3Uri": f"s3://example-bucket/models/sentiment-sagemaker/{EXECUTION_ID}/checkpoints/",
        "LocalPath": "/opt/ml/checkpoints"}


def test_the_private_subnets_are_the_networks_private_ones(template):
    body = next(iter(template.find_resources("AWS::SageMaker::Pipeline").values()))
    imports = [part["Fn::ImportValue"] for part in body["Properties"]["PipelineDefinition"]
               ["PipelineDefinitionBody"]["Fn::Join"][1] if isinstance(part, dict) and "Fn::ImportValue" in part]
    subnets = [name for name in imports if "Subnet" in name]
    assert len(subnets) == 2 and all("privateSubnet" in name for name in subnets)


def test_kms_volume_key_is_set_where_the_instance_has_ebs_storage():
    base = {"training.backend": "sagemaker"}
    nvme = settings_from_context({**base, "training.instance_type": "g5.12xlarge"}).training
    ebs = settings_from_context({**base, "training.instance_type": "p3.16xlarge"}).training
    resources = sagemaker_training.Resources("b", "arn:key", "arn:role", "sg", ["s"], "s3://c/a.zip", "s3://c/b.zip",
                                             "image", "image", "ml.c7g.4xlarge", "group")
    assert has_instance_storage(nvme.sagemaker_instance_type) and not has_instance_storage(ebs.sagemaker_instance_type)
    assert "VolumeKmsKeyId" not in sagemaker_training.training_request(nvme, resources)["ResourceConfig"]
    assert sagemaker_training.training_request(ebs, resources)["ResourceConfig"]["VolumeKmsKeyId"] == "arn:key"
    on_demand = sagemaker_training.training_request(settings_from_context(base).training, resources)
    assert "EnableManagedSpotTraining" not in on_demand
    assert on_demand["StoppingCondition"] == {"MaxRuntimeInSeconds": 6 * 3600}


def test_image_is_what_sagemaker_core_retrieves_for_the_region(definition):
    from sagemaker.core import image_uris

    image = definition["Steps"][0]["Arguments"]["AlgorithmSpecification"]["TrainingImage"]
    assert image == image_uris.retrieve(framework="pytorch-amzn2023", region="us-west-2", version="2.13",
                                        instance_type="ml.p4d.24xlarge", image_scope="training")


def test_the_job_starts_through_the_images_entrypoint_with_the_ofi_plugin(definition):
    """The image's entrypoint.sh first (its CUDA compat check, then exec "$@"); NCCL loads aws-ofi-nccl by name.

    FI_PROVIDER=efa and RDMA come from training.sagemaker_entry per instance type (tests/training/
    test_sagemaker_entry.py), as SageMaker's own torchrun driver sets them."""
    algorithm = definition["Steps"][0]["Arguments"]["AlgorithmSpecification"]
    assert algorithm["ContainerEntrypoint"][:3] == ["/usr/local/bin/entrypoint.sh", "/bin/bash", "-c"]
    assert definition["Steps"][0]["Arguments"]["Environment"]["NCCL_NET_PLUGIN"] == "ofi"


def test_the_job_makes_the_int8_graph_for_the_endpoints_instance_type(definition):
    from training.sagemaker_entry import SERVE_ON_ENV

    environment = definition["Steps"][0]["Arguments"]["Environment"]
    assert environment[SERVE_ON_ENV] == settings_from_context({}).sentiment.instance_type


def test_same_trainer_flags_as_the_ec2_backend(definition):
    from stacks.training import train_args

    algorithm = definition["Steps"][0]["Arguments"]["AlgorithmSpecification"]
    assert " ".join(algorithm["ContainerArguments"]) == train_args(settings_from_context({}).training)
    assert all(len(item) <= 256 for item in algorithm["ContainerEntrypoint"] + algorithm["ContainerArguments"])
    assert "training/sagemaker_bootstrap.sh" in algorithm["ContainerEntrypoint"][3]


def test_metric_regexes_read_the_trainers_report_lines(definition):
    """The gate's metric comes from the line train_sentiment._report prints on rank 0."""
    import contextlib
    import io
    from pathlib import Path

    from training.train_sentiment import _report

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _report({"validation": {"accuracy": 0.8, "recall_macro": 0.7512, "f1_macro": 0.74}, "test": None,
                 "train_runtime": 1.0, "train_samples_per_second": 2.0}, Path("model"))
    metrics = {m["Name"]: m["Regex"] for m in definition["Steps"][0]["Arguments"]["AlgorithmSpecification"]
               ["MetricDefinitions"]}
    found = [re.search(metrics[GATE_METRIC], line) for line in printed.getvalue().splitlines()]
    assert [float(m.group(1)) for m in found if m] == [0.751]


# --- gate, registration, failure ----------------------------------------------------------------------

def test_gate_registers_pending_approval_with_metrics_or_fails(definition):
    gate = definition["Steps"][1]
    assert gate["Type"] == "Condition"
    condition = gate["Arguments"]["Conditions"][0]
    assert condition["Type"] == "GreaterThanOrEqualTo"
    assert condition["LeftValue"] == {"Get": "Steps.Train.FinalMetricDataList['validation:recall_macro'].Value"}
    assert condition["RightValue"] == 0.6
    metrics = definition["Steps"][0]["Arguments"]["AlgorithmSpecification"]["MetricDefinitions"]
    assert {m["Name"] for m in metrics} == set(FINAL_METRICS)  # the stand-in answers only what the job defines
    register = _request(gate["Arguments"]["IfSteps"][0])
    assert register["ModelPackageGroupName"] == "mlrecipes-dev-sentiment"
    assert register["ModelApprovalStatus"] == "PendingManualApproval"
    container = register["InferenceSpecification"]["Containers"][0]
    assert container["ModelDataUrl"] == MODEL_URL
    assert container["Image"] == (f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/cdk-hnb659fds-container-assets-"
                                  f"{ACCOUNT}-us-west-2:{serving_image_tag()}")  # our image, as the stack tags it
    assert register["ModelMetrics"]["ModelQuality"]["Statistics"]["S3Uri"] == (
        f"s3://example-bucket/models/sentiment-sagemaker/{EXECUTION_ID}/checkpoints/metrics.json")
    assert register["CustomerMetadataProperties"]["validation_recall_macro"] == "0.7123"
    fail = _evaluate(gate["Arguments"]["ElseSteps"][0])
    assert fail["Type"] == "Fail"
    assert fail["Arguments"]["ErrorMessage"] == "validation macro recall below the minimum 0.6: 0.7123"


def test_group_is_the_one_the_operations_stack_creates(synthesized):
    operations = synthesized("dev-sagemaker").template("operations")
    operations.has_resource_properties("AWS::SageMaker::ModelPackageGroup",
                                       {"ModelPackageGroupName": "mlrecipes-dev-sentiment"})


# --- roles, network, backends -------------------------------------------------------------------------

def _statements(template, role_prefix: str) -> dict[str, dict]:
    policies = template.find_resources("AWS::IAM::Policy")
    policy = next(p for name, p in policies.items() if name.startswith(role_prefix))
    return {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}


def test_pipeline_role_passes_only_the_training_role_and_registers_in_one_group(template):
    statements = _statements(template, "PipelineRole")
    assert set(statements) == {"RunTrainingJobs", "PassTrainingRole", "RegisterModels"}
    passed = statements["PassTrainingRole"]
    assert passed["Resource"] == {"Fn::GetAtt": [next(iter(template.find_resources(
        "AWS::IAM::Role", {"Properties": {"Description": _training_role_description()}}))), "Arn"]}
    assert passed["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
    assert all(r != "*" for s in statements.values() for r in _as_list(s["Resource"]))
    resources = json.dumps(statements["RegisterModels"]["Resource"])
    assert "model-package-group/mlrecipes-dev-sentiment" in resources


def _training_role_description():
    from aws_cdk.assertions import Match

    return Match.string_like_regexp("^SageMaker training job")


def _as_list(value):
    return value if isinstance(value, list) else [value]


def test_training_role_writes_only_its_run_prefix(template):
    statements = _statements(template, "TrainingRole")
    objects = json.dumps(statements["RunOutputsAndCheckpoints"]["Resource"])
    assert "/models/sentiment-sagemaker/*" in objects
    assert statements["ListCheckpoints"]["Condition"] == {"StringLike": {"s3:prefix": ["models/sentiment-sagemaker/*"]}}
    assert "s3:PutObject" not in json.dumps(statements["ReadCode"])


def test_instances_reach_each_other_and_nothing_reaches_them(template):
    template.resource_count_is("AWS::EC2::SecurityGroupIngress", 1)
    ingress = next(iter(template.find_resources("AWS::EC2::SecurityGroupIngress").values()))["Properties"]
    assert ingress["IpProtocol"] == "-1"
    assert ingress["SourceSecurityGroupId"] == ingress["GroupId"]


def test_backends_are_exclusive(synthesized):
    sagemaker_names = synthesized("dev-sagemaker").templates
    assert sorted(name for name in sagemaker_names if name.endswith("training")) == [
        "mlrecipes-dev-sagemaker-training"]  # no EC2 training stack
    assert not any(name.endswith("-sagemaker-training") for name in synthesized("prod-training").templates)


def test_template_passes_cfn_lint_without_a_warning(synthesized):
    import subprocess
    import sys

    template = synthesized("dev-sagemaker").outdir / "mlrecipes-dev-sagemaker-training.template.json"
    runner = "import sys; from cfnlint.runner import main; sys.exit(main())"
    result = subprocess.run([sys.executable, "-c", runner, str(template)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_registered_package_carries_the_sentiment_stacks_container_environment(definition):
    """Deployed from the registry directly, our server gets the settings the sentiment stack gives it."""
    from stacks.sentiment import server_environment

    register = _request(definition["Steps"][1]["Arguments"]["IfSteps"][0])
    container = register["InferenceSpecification"]["Containers"][0]
    assert container["Environment"] == server_environment(settings_from_context({}).sentiment)
    assert int(container["Environment"]["OMP_NUM_THREADS"]) >= 1
