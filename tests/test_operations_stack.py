"""Operations: registration on _SUCCESS, the watchdog schedule, dead letters, alarms and the dashboard."""

from __future__ import annotations

import json

from aws_cdk.assertions import Match


def _functions(template) -> dict[str, dict]:
    found = template.find_resources("AWS::Lambda::Function")
    return {f["Properties"]["Handler"] + ":" + json.dumps(f["Properties"]["Environment"]["Variables"].get(
        "POWERTOOLS_SERVICE_NAME")): f["Properties"] for f in found.values()}


def _by_service(template, service: str) -> dict:
    return next(p for k, p in _functions(template).items() if f'"{service}"' in k)


def test_artifact_bucket_sends_events_to_eventbridge_without_a_custom_resource(synthesized):
    template = synthesized("dev").template("artifacts")
    template.has_resource_properties("AWS::S3::Bucket", {
        "NotificationConfiguration": {"EventBridgeConfiguration": {"EventBridgeEnabled": True}}})
    template.resource_count_is("AWS::Lambda::Function", 0)


def test_functions_use_the_latest_runtime_the_pinned_powertools_layer_and_a_dead_letter_queue(synthesized):
    template = synthesized("dev").template("operations")
    layers = template.find_resources("AWS::Lambda::LayerVersion")
    assert len(layers) == 1
    [(layer_id, layer)] = layers.items()
    assert "Powertools for AWS Lambda (Python) 3.37.0" in layer["Properties"]["Description"]
    for service in ("register-model", "training-watchdog"):
        function = _by_service(template, service)
        assert function["Runtime"] == "python3.14"
        assert function["Handler"] == "handler.handler"
        assert function["Layers"] == [{"Ref": layer_id}]
        assert "DeadLetterConfig" in function and "ReservedConcurrentExecutions" not in function
    for role in template.find_resources("AWS::IAM::Role").values():
        assert "ManagedPolicyArns" not in role["Properties"]


def test_register_model_runs_on_success_markers_only(synthesized):
    template = synthesized("dev").template("operations")
    template.has_resource_properties("AWS::Events::Rule", {
        "EventPattern": {
            "source": ["aws.s3"], "detail-type": ["Object Created"],
            "detail": {"object": {"key": [{"wildcard": "models/sentiment/*/_SUCCESS"}]},
                       "bucket": {"name": [Match.any_value()]}},
        },
        "Targets": [Match.object_like({"DeadLetterConfig": Match.any_value(),
                                       "RetryPolicy": {"MaximumEventAgeInSeconds": 7200, "MaximumRetryAttempts": 4}})],
    })
    function = _by_service(template, "register-model")
    variables = function["Environment"]["Variables"]
    assert variables["MODEL_PACKAGE_GROUP"] == "mlrecipes-dev-sentiment"
    assert "-container-assets-" in json.dumps(variables["INFERENCE_IMAGE"])  # our serving image (next test)
    template.has_resource_properties("AWS::SageMaker::ModelPackageGroup",
                                     {"ModelPackageGroupName": "mlrecipes-dev-sentiment"})


def test_registration_names_the_image_the_sentiment_stack_deploys(synthesized):
    """Issue 43: a registered package names our serving image (not the retired TorchServe DLC), at the repository
    and tag the sentiment stack of the same code pushes it to, known at synth without building it here."""
    result = synthesized("prod-sentiment")
    variables = _by_service(result.template("operations"), "register-model")["Environment"]["Variables"]
    separator, parts = variables["INFERENCE_IMAGE"]["Fn::Join"]
    registered = separator.join(part if isinstance(part, str) else f"${{{part['Ref']}}}" for part in parts)
    [model] = result.template("sentiment").find_resources("AWS::SageMaker::Model").values()
    assert registered == model["Properties"]["PrimaryContainer"]["Image"]["Fn::Sub"]
    [assets] = result.outdir.glob("*-operations.assets.json")
    assert json.loads(assets.read_text()).get("dockerImages", {}) == {}  # deploying operations builds no image


def test_watchdog_runs_on_a_schedule_and_may_terminate_only_tagged_training_instances(synthesized):
    template = synthesized("dev").template("operations")
    template.has_resource_properties("AWS::Events::Rule", {"ScheduleExpression": "rate(15 minutes)"})
    policies = [p["Properties"]["PolicyDocument"]["Statement"]
                for k, p in template.find_resources("AWS::IAM::Policy").items() if "Watchdog" in k]
    [statements] = policies
    terminate = next(s for s in statements if s.get("Sid") == "TerminateOurTrainingInstances")
    assert terminate["Action"] == "ec2:TerminateInstances"
    assert not any("ec2:StopInstances" in str(s["Action"]) for s in statements)
    assert terminate["Condition"] == {"StringEquals": {"aws:ResourceTag/project": "mlrecipes",
                                                  "aws:ResourceTag/environment": "dev",
                                                  "aws:ResourceTag/component": "training"}}
    assert _by_service(template, "training-watchdog")["Environment"]["Variables"]["DEFAULT_MAX_HOURS"] == "6"


def test_training_instances_carry_the_tags_the_watchdog_reads(synthesized):
    template = synthesized("prod-training").template("training")
    [instance] = template.find_resources("AWS::EC2::Instance").values()
    tags = {t["Key"]: t["Value"] for t in instance["Properties"]["Tags"]}
    assert (tags["component"], tags["max-hours"], tags["run-id"]) == ("training", "6", "run-0001")


def test_errors_and_dead_letters_raise_alarms_on_the_topic(synthesized):
    template = synthesized("dev").template("operations")
    alarms = template.find_resources("AWS::CloudWatch::Alarm")
    assert {a["Properties"]["MetricName"] for a in alarms.values()} == {
        "Errors", "ApproximateNumberOfMessagesVisible"}
    assert len(alarms) == 3
    for alarm in alarms.values():
        assert "Fn::ImportValue" in alarm["Properties"]["AlarmActions"][0]


def test_alarm_email_subscribes_when_set(synthesized):
    everything = {name: t for name, t in synthesized("prod-sentiment").templates.items()}
    subscriptions = [r for t in everything.values() for r in t["Resources"].values()
                     if r["Type"] == "AWS::SNS::Subscription"]
    assert [s["Properties"]["Endpoint"] for s in subscriptions] == ["ops@example.com"]
    assert not any(r["Type"] == "AWS::SNS::Subscription" for t in synthesized("dev").templates.values()
                   for r in t["Resources"].values())


def _dashboard_body(template) -> str:
    [dashboard] = template.find_resources("AWS::CloudWatch::Dashboard").values()
    body = dashboard["Properties"]["DashboardBody"]
    return body if isinstance(body, str) else json.dumps(body)


def test_dashboard_shows_enabled_endpoints_and_training_runs(synthesized):
    with_endpoint = _dashboard_body(synthesized("prod-sentiment").template("operations"))
    for fragment in ("prod-sentiment", "ModelLatency", "p90", "Invocation5XXErrors", "Invocation4XXErrors",
                     "CPUUtilization", "InvocationsPerInstance", "RunsRegistered", "InstancesTerminated"):
        assert fragment in with_endpoint, fragment
    without = _dashboard_body(synthesized("dev").template("operations"))
    assert "dev-sentiment" not in without and "RunsRegistered" in without
