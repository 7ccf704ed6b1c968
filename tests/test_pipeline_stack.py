"""The delivery pipeline: test and synth from the repository, then dev -> staging -> approval -> prod."""

from __future__ import annotations

import json

from aws_cdk.assertions import Match, Template

from stacks.pipeline import synth_command


def _pipeline(synthesized) -> Template:
    return Template.from_json(synthesized("pipeline").templates["mlrecipes-pipeline"])


def _codepipeline(template: Template) -> dict:
    [pipeline] = template.find_resources("AWS::CodePipeline::Pipeline").values()
    return pipeline["Properties"]


def test_stages_run_in_order_with_a_manual_approval_before_prod(synthesized):
    stages = _codepipeline(_pipeline(synthesized))["Stages"]
    names = [s["Name"] for s in stages]
    assert names[:3] == ["Source", "Build", "UpdatePipeline"]
    assert [n for n in names if n in ("dev", "staging", "prod")] == ["dev", "staging", "prod"]
    assert names.index("dev") < names.index("staging") < names.index("prod")
    by_name = {s["Name"]: s for s in stages}
    approvals = {name: [a for a in stage["Actions"] if a["ActionTypeId"]["Category"] == "Approval"]
                 for name, stage in by_name.items()}
    assert [a["Name"] for a in approvals["prod"]] == ["Promote-to-prod"]
    assert approvals["dev"] == [] and approvals["staging"] == []
    first_prod_deploy = min(a["RunOrder"] for a in by_name["prod"]["Actions"]
                            if a["ActionTypeId"]["Category"] == "Deploy")
    assert approvals["prod"][0]["RunOrder"] < first_prod_deploy


def test_source_is_the_configured_connection(synthesized):
    source = _codepipeline(_pipeline(synthesized))["Stages"][0]["Actions"][0]
    assert source["ActionTypeId"]["Provider"] == "CodeStarSourceConnection"
    assert source["Configuration"]["FullRepositoryId"] == "my-org/ml-recipes"
    assert source["Configuration"]["BranchName"] == "main"


def test_synth_step_installs_tests_and_synthesizes_with_the_overrides(synthesized):
    template = _pipeline(synthesized)
    projects = template.find_resources("AWS::CodeBuild::Project")
    specs = [json.loads(p["Properties"]["Source"]["BuildSpec"]) for p in projects.values()
             if "BuildSpec" in p["Properties"]["Source"]]
    [synth] = [s for s in specs if "make test" in json.dumps(s)]
    # Only what synth and the infrastructure tests need: no torch, no training stack.
    assert synth["phases"]["install"]["commands"] == ["make install-infra"]
    assert synth["phases"]["build"]["commands"] == [
        "make test-infra",
        "npx cdk synth --quiet -c pipeline.enabled=true -c prod/artifacts.noncurrent_version_expiration_days=400"]


def test_synth_command_quotes_overrides():
    command = synth_command({"pipeline.enabled": True, "falcon.model_id": "org/model name",
                             "network.availability_zones": ("a", "b")})
    assert command == ("npx cdk synth --quiet -c pipeline.enabled=true -c 'falcon.model_id=org/model name' "
                       "-c network.availability_zones=a,b")


def test_stages_deploy_the_same_stack_names_as_a_workstation(synthesized):
    names = synthesized("pipeline").templates
    for env_name in ("dev", "staging", "prod"):
        for part in ("artifacts", "network", "operations"):
            assert f"mlrecipes-pipeline/{env_name}/mlrecipes-{env_name}-{part}" in names
    manifest = json.loads((synthesized("pipeline").outdir / "assembly-mlrecipes-pipeline-prod"
                           / "manifest.json").read_text())
    stack_names = {a["properties"]["stackName"] for a in manifest["artifacts"].values()
                   if a["type"] == "aws:cloudformation:stack"}
    assert stack_names == {"mlrecipes-prod-artifacts", "mlrecipes-prod-network", "mlrecipes-prod-operations"}


def test_environment_scoped_overrides_reach_their_stage_only(synthesized):
    templates = synthesized("pipeline").templates

    def expiry(env_name: str) -> int:
        bucket = next(r for r in templates[f"mlrecipes-pipeline/{env_name}/mlrecipes-{env_name}-artifacts"][
            "Resources"].values() if r["Type"] == "AWS::S3::Bucket" and "NotificationConfiguration" in r["Properties"])
        rules = bucket["Properties"]["LifecycleConfiguration"]["Rules"]
        return next(r["NoncurrentVersionExpiration"]["NoncurrentDays"] for r in rules
                    if "NoncurrentVersionExpiration" in r)

    assert (expiry("dev"), expiry("staging"), expiry("prod")) == (30, 90, 400)


def test_pipeline_artifacts_are_encrypted_logged_and_the_key_rotates(synthesized):
    template = _pipeline(synthesized)
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    template.has_resource_properties("AWS::S3::Bucket", {
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [Match.object_like({
            "ServerSideEncryptionByDefault": Match.object_like({"SSEAlgorithm": "aws:kms"})})]},
        "LoggingConfiguration": Match.object_like({"LogFilePrefix": "pipeline-artifacts/"}),
    })
    for role in template.find_resources("AWS::IAM::Role").values():
        assert not any("FullAccess" in json.dumps(arn) or "AdministratorAccess" in json.dumps(arn)
                       for arn in role["Properties"].get("ManagedPolicyArns", []))


def test_summary_lists_the_stage_stacks_too(synthesized, capsys):
    from stacks.summary import main

    assert main([str(synthesized("pipeline").outdir)]) == 0
    out = capsys.readouterr().out
    assert "mlrecipes-pipeline " in out
    for env_name in ("dev", "staging", "prod"):
        assert f"mlrecipes-pipeline/{env_name}/mlrecipes-{env_name}-network" in out
    assert "10 stacks," in out


def test_infra_requirements_install_no_torch_and_cover_the_test_tools():
    from tests.conftest import REPO_ROOT

    lines = [line.split("==")[0] for line in (REPO_ROOT / "requirements-infra.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    assert "-r requirements.txt" in lines and "torch" not in lines and "-r requirements-dev.txt" not in lines
    assert {"pytest", "boto3", "moto", "cfn-lint", "ruff"} <= set(lines)
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "install-infra:" in makefile and "test-infra:" in makefile and "tests/test_lifecycle.py" in makefile


def test_pipeline_is_termination_protected(synthesized):
    manifest = json.loads((synthesized("pipeline").outdir / "manifest.json").read_text())
    assert manifest["artifacts"]["mlrecipes-pipeline"]["properties"]["terminationProtection"] is True


def test_artifact_access_logs_can_be_delivered(synthesized):
    """The logs bucket has ACLs off, so S3 delivers server access logs only where its bucket policy lets the
    logging service write (https://docs.aws.amazon.com/AmazonS3/latest/userguide/enable-server-access-logging.html)."""
    template = _pipeline(synthesized).to_json()
    buckets = {k: r for k, r in template["Resources"].items() if r["Type"] == "AWS::S3::Bucket"}
    [(source_id, source)] = [(k, r) for k, r in buckets.items() if "LoggingConfiguration" in r["Properties"]]
    target_id = source["Properties"]["LoggingConfiguration"]["DestinationBucketName"]["Ref"]
    [policy] = [r["Properties"] for r in template["Resources"].values()
                if r["Type"] == "AWS::S3::BucketPolicy" and r["Properties"]["Bucket"] == {"Ref": target_id}]
    [statement] = [s for s in policy["PolicyDocument"]["Statement"]
                   if s.get("Principal") == {"Service": "logging.s3.amazonaws.com"}]
    assert statement["Effect"] == "Allow" and statement["Action"] == "s3:PutObject"
    assert "pipeline-artifacts/*" in json.dumps(statement["Resource"])
    assert statement["Condition"]["ArnLike"]["aws:SourceArn"] == {"Fn::GetAtt": [source_id, "Arn"]}


def test_the_arm64_serving_image_is_built_natively_and_published_before_any_stage_deploys(synthesized):
    """Issue 21: the sentiment image is a Docker asset of every stage; an arm64 CodeBuild project publishes it."""
    template = Template.from_json(synthesized("pipeline-sentiment").templates["mlrecipes-pipeline"])
    stages = _codepipeline(template)["Stages"]
    names = [stage["Name"] for stage in stages]
    assert names.index("Assets") < names.index("dev")
    [publish] = [action for action in stages[names.index("Assets")]["Actions"] if action["Name"] == "ServingImage"]
    project = template.find_resources("AWS::CodeBuild::Project")[publish["Configuration"]["ProjectName"]["Ref"]]
    environment = project["Properties"]["Environment"]
    assert environment["Type"] == "ARM_CONTAINER"
    assert environment["Image"] == "aws/codebuild/amazonlinux-aarch64-standard:3.0"
    assert environment["PrivilegedMode"] is True
    assert "cdk-assets" in project["Properties"]["Source"]["BuildSpec"]
