"""Deploy and update rules that no single template shows: synthesize the states a user moves between, check the rule.

Each test names the rule CloudFormation or the service applies at deploy or update time, and where it is documented.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest

from settings import SettingsError, load_settings
from stacks.sentiment import blue_green_policy
from tests import botocore_rules
from tests.conftest import synthesize

MODEL = {"sentiment.enabled": "true",
         "sentiment.model_data_url": "s3://example-bucket/models/sentiment/run-0001/model.tar.gz"}
TYPE_A, TYPE_B = "ml.c7g.4xlarge", "ml.c7g.2xlarge"
# The documented way to change an autoscaled endpoint's instance type (README, "Updating"), in prod (min 2, max 4).
INSTANCE_TYPE_PATH = {
    "A, autoscaled": {**MODEL, "sentiment.instance_type": TYPE_A},
    "A, fixed": {**MODEL, "sentiment.instance_type": TYPE_A, "sentiment.autoscaling": "false"},
    "B, fixed": {**MODEL, "sentiment.instance_type": TYPE_B, "sentiment.autoscaling": "false"},
    "B, autoscaled": {**MODEL, "sentiment.instance_type": TYPE_B, "sentiment.bake_minutes": "60"},
}


@pytest.fixture(scope="module")
def states(tmp_path_factory, synthesized):
    """Synthesized states by name, each built once for this module."""
    cache = {"workloads off": synthesized("prod"), "one instance, bake 1 min": synthesized("smoke-all"),
             "workloads on": synthesized("prod-all-on")}

    def get(name: str):
        if name not in cache:
            overrides = INSTANCE_TYPE_PATH[name]
            folder = re.sub(r"[^a-z0-9]+", "-", name)
            cache[name] = synthesize(tmp_path_factory.mktemp(f"lifecycle-{folder}"), "prod", overrides)
        return cache[name]

    return get


def resources(template: dict, kind: str) -> list[dict]:
    return [r for r in template["Resources"].values() if r["Type"] == kind]


def exports(state) -> set[str]:
    return {output["Export"]["Name"] for template in state.templates.values()
            for output in template.get("Outputs", {}).values() if "Export" in output}


def imports(state) -> set[str]:
    names = set()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "Fn::ImportValue" and isinstance(value, str):
                    names.add(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for template in state.templates.values():
        walk(template)
    return names


# --- CloudFormation: an export in use cannot be removed ---------------------------------------------------------

def test_exports_in_use_never_vanish_when_workloads_are_switched_off_and_on(states):
    """CloudFormation refuses to modify or remove an output value another stack imports (Fn::ImportValue,
    restrictions on cross-stack references:
    https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/intrinsic-function-reference-importvalue.html).
    """
    path = [states("workloads off"), states("workloads on"), states("workloads off")]
    in_use = set().union(*(imports(state) for state in path))
    assert any(":ExportsOutputRefVpc" in name for name in in_use)  # the workloads do import the network
    for step, state in enumerate(path):
        missing = in_use - exports(state)
        assert not missing, f"state {step} of off -> on -> off drops exports a deployed stack imports: {missing}"


# --- Lambda: reserved concurrency must leave the account's unreserved minimum --------------------------------

def test_no_lambda_reserves_concurrency_by_default(states):
    """Lambda refuses a reservation that leaves the account fewer unreserved executions than its minimum: "You can
    reserve up to the Unreserved account concurrency value that is shown, minus 100" (Lambda developer guide,
    https://docs.aws.amazon.com/lambda/latest/dg/configuration-concurrency.html). Accounts with a low quota see
    a lower minimum in the error ("... below its minimum value of [10]"), and a new account's whole quota may be
    that minimum, so any reservation fails there.
    """
    for name in ("workloads off", "workloads on"):
        for template in states(name).templates.values():
            for function in resources(template, "AWS::Lambda::Function"):
                assert "ReservedConcurrentExecutions" not in function["Properties"], function["Properties"]


def test_operations_functions_are_traced(states):
    template = states("workloads off").template("operations").to_json()
    functions = resources(template, "AWS::Lambda::Function")
    assert len(functions) == 2 and all(f["Properties"]["TracingConfig"] == {"Mode": "Active"} for f in functions)


# --- Application Auto Scaling: no instance-type change on an autoscaled variant --------------------------------

def sentiment(state) -> dict:
    (name,) = [n for n in state.templates if n.endswith("-sentiment")]
    return state.templates[name]


def variant(state) -> dict:
    (config,) = resources(sentiment(state), "AWS::SageMaker::EndpointConfig")
    (production_variant,) = config["Properties"]["ProductionVariants"]
    return production_variant


def endpoint(state) -> dict:
    (found,) = resources(sentiment(state), "AWS::SageMaker::Endpoint")
    return found["Properties"]


def autoscaled(state) -> bool:
    name = endpoint(state)["EndpointName"]
    targets = resources(sentiment(state), "AWS::ApplicationAutoScaling::ScalableTarget")
    return any(t["Properties"]["ResourceId"] == f"endpoint/{name}/variant/{variant(state)['VariantName']}"
               for t in targets)


def update_refused(before, after) -> bool:
    """Whether Application Auto Scaling refuses the endpoint update of a deploy from `before` to `after`.

    CloudFormation updates the endpoint before it deletes a removed scalable target (deletions run in the clean-up
    phase) and creates a new target after the endpoint (it depends on it), so what counts is `before`.
    """
    return variant(before)["InstanceType"] != variant(after)["InstanceType"] and autoscaled(before)


def test_instance_type_change_path_never_updates_an_autoscaled_variant(states):
    """Application Auto Scaling fails an endpoint update that changes the instance type of a variant registered as
    a scalable target (a new model alone is allowed); deregister first, register again after:
    https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-scaling-update.html. The README's path: autoscaling
    off, new type, autoscaling on.
    """
    path = [states(name) for name in INSTANCE_TYPE_PATH]
    assert [autoscaled(s) for s in path] == [True, False, False, True]
    assert [variant(s)["InstanceType"] for s in path] == [TYPE_A, TYPE_A, TYPE_B, TYPE_B]
    for before, after in itertools.pairwise(path):
        assert not update_refused(before, after)
    # The shortcut the README warns about is what the rule refuses (the check above can fail).
    assert update_refused(states("A, autoscaled"), states("B, autoscaled"))


def test_updates_keep_the_instance_count_autoscaling_reached(states):
    """Without RetainAllVariantProperties an update resets the fleet to the new config's initial count
    (UpdateEndpoint, SageMaker API reference). Without autoscaling the count comes from the config (min_instances).
    """
    for name in INSTANCE_TYPE_PATH:
        state = states(name)
        properties = endpoint(state)
        assert properties["RetainAllVariantProperties"] is True
        excluded = properties.get("ExcludeRetainedVariantProperties", [])
        expected = [] if autoscaled(state) else [{"VariantPropertyType": "DesiredInstanceCount"}]
        assert excluded == expected, name


# --- SageMaker blue/green: timeout beyond the waits, canary at most half the fleet ------------------------------

def check_blue_green(policy: dict, initial_instances: int) -> None:
    """The rules of BlueGreenUpdatePolicy and TrafficRoutingConfig, from the SageMaker API itself: every member's
    range and enum from botocore's service model (MaximumExecutionTimeoutInSeconds 600-28800, waits 0-3600 in the
    pinned botocore), the timeout above the wait interval plus the termination wait (the model's documentation of
    MaximumExecutionTimeoutInSeconds), and a canary of at most 50% of the variant's instances (CanarySize)."""
    shape = botocore_rules.shape("BlueGreenUpdatePolicy")
    assert botocore_rules.constraint_errors(policy, shape) == []
    assert "larger than the total waiting time" in shape.members["MaximumExecutionTimeoutInSeconds"].documentation
    routing = policy["TrafficRoutingConfiguration"]
    waits = routing.get("WaitIntervalInSeconds", 0) + policy.get("TerminationWaitInSeconds", 0)
    timeout = policy["MaximumExecutionTimeoutInSeconds"]
    # The new fleet is created and health-checked inside the same timeout: at least 10 minutes for it.
    assert timeout - waits >= 600, (timeout, waits)
    if routing["Type"] == "CANARY":
        size = routing["CanarySize"]
        canary = size["Value"] if size["Type"] == "INSTANCE_COUNT" else -(-initial_instances * size["Value"] // 100)
        assert canary >= 1 and 2 * canary <= initial_instances, (canary, initial_instances)


def test_the_blue_green_check_refuses_what_the_api_refuses():
    """check_blue_green can fail: a timeout outside botocore's range, one that does not cover the waits."""
    good = {"MaximumExecutionTimeoutInSeconds": 1920, "TerminationWaitInSeconds": 60,
            "TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 60}}
    check_blue_green(good, 1)
    for timeout in (599, 28801, 700):  # below, above the API's range; in range but not beyond waits + 10 min
        with pytest.raises(AssertionError):
            check_blue_green({**good, "MaximumExecutionTimeoutInSeconds": timeout,
                              "TerminationWaitInSeconds": 3600 if timeout == 700 else 60}, 1)
    with pytest.raises(AssertionError):
        check_blue_green({**good, "TerminationWaitInSeconds": 3601}, 1)


@pytest.mark.parametrize("name", ["one instance, bake 1 min", "A, autoscaled", "B, autoscaled"])
def test_blue_green_timeout_exceeds_the_waits_and_canary_fits_the_fleet(states, name):
    state = states(name)
    check_blue_green(endpoint(state)["DeploymentConfig"]["BlueGreenUpdatePolicy"],
                     variant(state)["InitialInstanceCount"])


def test_one_instance_fleet_shifts_all_at_once_and_still_bakes(states):
    """A fleet of one has no canary of at most half of it: all at once, watched by the rollback alarms."""
    state = states("one instance, bake 1 min")
    assert variant(state)["InitialInstanceCount"] == 1 and not autoscaled(state)
    deployment = endpoint(state)["DeploymentConfig"]
    policy = deployment["BlueGreenUpdatePolicy"]
    assert policy["TrafficRoutingConfiguration"] == {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 60}
    assert deployment["AutoRollbackConfiguration"]["Alarms"]


@pytest.mark.parametrize("bake_minutes", [1, 2, 30, 59, 60])
@pytest.mark.parametrize("instances", [1, 2, 3, 4, 10, 20])
@pytest.mark.parametrize("canary_percent", [1, 10, 34, 50])
def test_every_allowed_setting_gives_an_accepted_policy(bake_minutes, instances, canary_percent):
    config = load_settings("prod", {"sentiment.bake_minutes": bake_minutes, "sentiment.min_instances": instances,
                                    "sentiment.max_instances": instances,
                                    "sentiment.canary_percent": canary_percent}).sentiment
    policy = blue_green_policy(config)
    routing = policy.traffic_routing_configuration
    as_template = {
        "MaximumExecutionTimeoutInSeconds": policy.maximum_execution_timeout_in_seconds,
        "TerminationWaitInSeconds": policy.termination_wait_in_seconds,
        "TrafficRoutingConfiguration": {
            "Type": routing.type, "WaitIntervalInSeconds": routing.wait_interval_in_seconds,
            **({"CanarySize": {"Type": routing.canary_size.type, "Value": routing.canary_size.value}}
               if routing.canary_size else {})},
    }
    check_blue_green(as_template, instances)
    assert (routing.type == "CANARY") == (instances >= 2)


def test_bake_minutes_beyond_the_limit_is_refused_before_deploy():
    with pytest.raises(SettingsError, match=r"sentiment\.bake_minutes"):
        load_settings("prod", {"sentiment.bake_minutes": 61})


# --- CloudFormation: a parameter that does not exist fails the change set ------------------------------------

def test_powertools_layer_is_built_from_the_pinned_package_not_an_ssm_parameter(states):
    """An SSM parameter type whose parameter is missing fails the change set; the Powertools public parameter
    for a release was missing once (aws-powertools/powertools-lambda-python issue #7689, PR #7695)."""
    for name in ("workloads off", "workloads on"):
        template = states(name).template("operations").to_json()
        assert "powertools" not in json.dumps(template.get("Parameters", {})).lower()
        (layer,) = resources(template, "AWS::Lambda::LayerVersion")
        assert layer["Properties"]["CompatibleRuntimes"] == ["python3.14"]
        for function in resources(template, "AWS::Lambda::Function"):
            assert function["Properties"]["Layers"] == [{"Ref": next(
                k for k, v in template["Resources"].items() if v["Type"] == "AWS::Lambda::LayerVersion")}]


def test_layer_folder_holds_powertools_and_its_dependencies(tmp_path):
    from stacks.powertools import layer_directory

    folder = layer_directory("3.37.0", root=tmp_path)
    python = folder / "python"
    assert (python / "aws_lambda_powertools" / "__init__.py").is_file()
    assert '"3.37.0"' in (python / "aws_lambda_powertools" / "shared" / "version.py").read_text()
    assert (python / "jmespath" / "__init__.py").is_file() and (python / "typing_extensions.py").is_file()
    assert not list(python.rglob("__pycache__"))
    assert layer_directory("3.37.0", root=tmp_path) == folder  # built once, reused


def test_a_powertools_version_other_than_the_installed_one_is_refused(tmp_path):
    from stacks.powertools import layer_directory

    with pytest.raises(SettingsError, match=r"operations.powertools_version='3.0.0'.*installed.*3\.37\.0"):
        layer_directory("3.0.0", root=tmp_path)


# --- VPC: egress must reach what serves the download ----------------------------------------------------------

def test_s3_mode_falcon_may_reach_s3_through_the_gateway_endpoint(states):
    """A gateway endpoint adds a route to the service's prefix list, and a security group's outbound rule reaches a
    service through a VPC endpoint by that prefix list's id (https://docs.aws.amazon.com/vpc/latest/privatelink/
    gateway-endpoints.html; EC2 API, IpPermission PrefixListIds): the VPC CIDR does not cover S3's addresses."""
    template = states("workloads on").templates["mlrecipes-prod-falcon"]
    ((group_id, group),) = [(k, r) for k, r in template["Resources"].items() if r["Type"] == "AWS::EC2::SecurityGroup"]
    egress = group["Properties"].get("SecurityGroupEgress", []) + [
        rule["Properties"] for rule in resources(template, "AWS::EC2::SecurityGroupEgress")
        if rule["Properties"]["GroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}]
    to_prefix_list = [rule for rule in egress if "DestinationPrefixListId" in rule]
    assert len(to_prefix_list) == 1
    rule = to_prefix_list[0]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 443, 443)
    lookup_id = rule["DestinationPrefixListId"]["Fn::GetAtt"][0]
    lookup = template["Resources"][lookup_id]
    assert lookup["Type"] == "Custom::AWS"
    call = json.loads(lookup["Properties"]["Create"])
    assert call["service"] == "EC2" and call["action"] == "describeManagedPrefixLists"
    assert call["parameters"]["Filters"] == [{"Name": "prefix-list-name", "Values": ["com.amazonaws.us-west-2.s3"]}]
    assert rule["DestinationPrefixListId"]["Fn::GetAtt"][1] == "PrefixLists.0.PrefixListId"


# --- Endpoint log groups: created or adopted by the stacks, with retention and the project key ----------------

def endpoint_log_groups(template: dict) -> dict[str, dict]:
    """The adopting custom resources (stacks/endpoint_logs.py) by logical id."""
    return {key: r for key, r in template["Resources"].items() if r["Type"] == "Custom::EndpointLogGroup"}


def test_endpoint_log_groups_exist_before_the_endpoints_with_retention_and_the_key(states):
    """SageMaker creates /aws/sagemaker/Endpoints/<name> itself on the first log line, so an AWS::Logs::LogGroup of
    that name fails with "already exists" wherever an endpoint has logged. No stack declares one; the custom
    resource creates it only if missing, is retained, and the endpoint waits for it."""
    state = states("workloads on")
    for endpoint_name in ("prod-sentiment", "prod-falcon"):
        template = state.templates[f"mlrecipes-{endpoint_name}"]
        assert not [r for r in resources(template, "AWS::Logs::LogGroup")
                    if "/aws/sagemaker/Endpoints/" in json.dumps(r["Properties"].get("LogGroupName", ""))]
        ((log_id, group),) = endpoint_log_groups(template).items()
        properties = group["Properties"]
        assert properties["LogGroupName"] == f"/aws/sagemaker/Endpoints/{endpoint_name}"
        assert properties["RetentionInDays"] == "90"
        assert "Fn::ImportValue" in json.dumps(properties["KmsKeyArn"])
        assert group["DeletionPolicy"] == group["UpdateReplacePolicy"] == "Retain"
        (endpoint_resource,) = resources(template, "AWS::SageMaker::Endpoint")
        assert log_id in endpoint_resource["DependsOn"]


def test_the_adopting_function_may_touch_only_its_endpoints_log_group(states):
    template = states("workloads on").templates["mlrecipes-prod-sentiment"]
    ((_, group),) = endpoint_log_groups(template).items()
    function_id = group["Properties"]["ServiceToken"]["Fn::GetAtt"][0]
    role_id = template["Resources"][function_id]["Properties"]["Role"]["Fn::GetAtt"][0]
    (policy,) = [r for r in resources(template, "AWS::IAM::Policy") if r["Properties"]["Roles"] == [{"Ref": role_id}]]
    everything = policy["Properties"]["PolicyDocument"]["Statement"]
    # Active tracing (issue 34): CDK adds X-Ray's own statement, which has no Sid and can name no narrower resource.
    tracing = [s for s in everything if "Sid" not in s]
    assert [sorted(s["Action"]) for s in tracing] == [["xray:PutTelemetryRecords", "xray:PutTraceSegments"]]
    statements = {s["Sid"]: s for s in everything if "Sid" in s}
    manage = statements["ManageEndpointLogGroup"]
    assert sorted(manage["Action"]) == ["logs:AssociateKmsKey", "logs:CreateLogGroup", "logs:PutRetentionPolicy"]
    arns = [json.dumps(arn) for arn in manage["Resource"]]
    assert len(arns) == 2 and all("log-group:/aws/sagemaker/Endpoints/prod-sentiment" in arn for arn in arns)
    assert sorted(statements) == ["ManageEndpointLogGroup", "WriteOwnLogs"]


# --- CDK feature flags: the pinned version's recommendations, each reviewed -----------------------------------

def recommended_flags() -> dict:
    """recommended-feature-flags.json of the installed aws-cdk-lib (what `cdk init` writes at that version)."""
    import importlib.util
    import tarfile
    from pathlib import Path

    package = Path(importlib.util.find_spec("aws_cdk").origin).parent
    (tgz,) = package.glob("_jsii/aws-cdk-lib@*.jsii.tgz")
    with tarfile.open(tgz, "r|gz") as tar:
        for member in tar:
            if member.name == "package/recommended-feature-flags.json":
                return json.load(tar.extractfile(member))
    raise AssertionError(f"no recommended-feature-flags.json in {tgz}")


def test_every_recommended_feature_flag_is_set_and_reviewed():
    from tests.conftest import REPO_ROOT

    context = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    review = (REPO_ROOT / "docs" / "feature-flags.md").read_text()
    recommended = recommended_flags()
    assert not [flag for flag in recommended if flag not in context]
    for flag in recommended:
        assert f"| `{flag}` | `{json.dumps(context[flag])}` |" in review, flag
    kept = {flag for flag, value in recommended.items() if context[flag] != value}
    assert kept == {"@aws-cdk/core:defaultCrossStackReferences", "@aws-cdk/core:explicitStackTags"}
    for flag in kept:
        assert re.search(rf"`{re.escape(flag)}`.*KEPT", review)


def test_endpoint_log_retention_follows_the_environment(states):
    template = states("one instance, bake 1 min").templates["mlrecipes-smoke-sentiment"]
    ((_, group),) = endpoint_log_groups(template).items()
    assert group["Properties"]["LogGroupName"] == "/aws/sagemaker/Endpoints/smoke-sentiment"
    assert group["Properties"]["RetentionInDays"] == "7"
