"""A self-mutating CDK pipeline: test, synthesize, then deploy each environment's stacks in order."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import pipelines
from constructs import Construct

from settings import Settings
from stacks.environment import EnvironmentStacks, build_environment
from stacks.nag import acknowledge, compliance
from stacks.toolchain import cdk_assets_version, cdk_cli_version

# CodeBuild's arm64 image for the asset publishing projects (native builds of the arm64 serving image).
ASSET_BUILD_IMAGE = codebuild.LinuxArmBuildImage.AMAZON_LINUX_2023_STANDARD_3_0
# How the pipeline publishes assets (aws-cdk-lib 2.273.0 pipelines/lib/codepipeline/codepipeline.js,
# `publishAssetsAction`): one CodeBuild project per asset runs `npm install -g cdk-assets@<cdk_assets_cli_version>`,
# then `cdk-assets --path "<stage assembly>/<stack>.assets.json" --verbose publish "<asset>:<destination>"`, with the
# cloud assembly as its working folder. CDK Pipelines' default version is `latest`: whatever npm serves that day, run
# with the rights to push to our buckets and registries. We pin it in package.json (stacks/toolchain.py), as we pin
# the CLI that synthesizes and that self-mutation installs (`npm install -g aws-cdk@<cli_version>`, default "2").
# cdk-assets 4.7.3 is one bundled file with no dependencies, so each run installs the same code, and it reads cloud
# assembly schema 54.x only: aws-cdk-lib stays at 2.273.0, the newest release that writes 54 (requirements.txt).
# tests/test_pipeline_publishing.py runs the node_modules copy on the pipeline's manifests, so a publisher that cannot
# read them fails `make test` instead of a deploy.
# Attestations: buildx adds a provenance attestation by default, which makes the pushed image an OCI image index
# (refused by SageMaker's CreateModel). cdk-assets 4.7.3 sets this variable for its `docker build` itself and hands
# its own environment to docker (`env: {...process.env, ...options.env}`; the test reads both in its bundle); set
# on the projects as well, it keeps attestations off should a release drop that
# (docs.docker.com/build/building/variables/).
ASSET_BUILD_ENVIRONMENT = {"BUILDX_NO_DEFAULT_ATTESTATIONS": "1"}


class EnvironmentStage(cdk.Stage):
    """One environment's stacks, named exactly as a workstation deploy names them."""

    def __init__(self, scope: Construct, settings: Settings) -> None:
        super().__init__(scope, settings.name, env=cdk.Environment(account=settings.account, region=settings.region))
        self.stacks: EnvironmentStacks = build_environment(self, settings)


def synth_command(overrides: Mapping[str, Any]) -> str:
    """The synth the pipeline runs on every change, with the overrides it was created with."""
    flags = " ".join(f"-c {shlex.quote(f'{key}={_flag(value)}')}" for key, value in sorted(overrides.items())
                     if key != "pipeline.enabled")
    return f"npx cdk synth --quiet -c pipeline.enabled=true {flags}".strip()


def _flag(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


class PipelineStack(cdk.Stack):
    def __init__(self, scope: Construct, *, settings: Settings, stages: list[Settings],
                 overrides: Mapping[str, Any]) -> None:
        config = settings.pipeline
        name = f"{settings.project}-pipeline"
        super().__init__(scope, name, stack_name=name,
                         env=cdk.Environment(account=config.account or settings.account,
                                             region=config.region or settings.region),
                         description=f"CDK pipeline for {settings.project}: {' -> '.join(s.name for s in stages)}",
                         termination_protection=True)
        for key, value in {"project": settings.project, "environment": "pipeline"}.items():
            cdk.Tags.of(self).add(key, value)

        access_logs = s3.Bucket(self, "ArtifactAccessLogs", encryption=s3.BucketEncryption.S3_MANAGED,
                                enforce_ssl=True, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                                lifecycle_rules=[s3.LifecycleRule(expiration=cdk.Duration.days(90))],
                                removal_policy=cdk.RemovalPolicy.RETAIN)
        acknowledge(access_logs, (*compliance("S3BucketReplicationEnabled"), *compliance("S3BucketVersioningEnabled"),
                                  *compliance("S3DefaultEncryptionKMS")),
                    "server access logs of the pipeline's working bucket: S3 delivers them only to SSE-S3 buckets; "
                    "they expire after 90 days and are not worth a replica or versions")
        source = pipelines.CodePipelineSource.connection(config.repository, config.branch,
                                                         connection_arn=config.connection_arn)
        synth = pipelines.ShellStep(
            "Synth",
            input=source,
            # The same commands as on a workstation, from the repository's pins: only what synth and the
            # infrastructure tests need (no torch); `make test` on a workstation or CI runs everything.
            install_commands=["make install-infra"],
            commands=["make test-infra", synth_command(overrides)],
            env={"CI": "true"},
            primary_output_directory="cdk.out",
        )
        self.pipeline = pipelines.CodePipeline(
            self, "Pipeline",
            synth=synth,
            self_mutation=True,
            # The pinned tools (package.json): the CLI that self-mutation installs, and the asset publisher.
            cli_version=cdk_cli_version(),
            cdk_assets_cli_version=cdk_assets_version(),
            cross_account_keys=True,
            enable_key_rotation=True,
            code_build_defaults=pipelines.CodeBuildOptions(build_environment=codebuild.BuildEnvironment(
                build_image=codebuild.LinuxBuildImage.STANDARD_7_0,
                compute_type=codebuild.ComputeType.LARGE,
            )),
            # Assets are built and published before any stage deploys. The sentiment serving image is linux/arm64
            # (inference/sentiment/image/Dockerfile): an arm64 build host builds it natively instead of emulating
            # every instruction under QEMU. Docker builds need privileged mode.
            asset_publishing_code_build_defaults=pipelines.CodeBuildOptions(
                build_environment=codebuild.BuildEnvironment(
                    build_image=ASSET_BUILD_IMAGE, compute_type=codebuild.ComputeType.LARGE, privileged=True,
                    environment_variables={name: codebuild.BuildEnvironmentVariable(value=value)
                                           for name, value in ASSET_BUILD_ENVIRONMENT.items()})),
        )
        self.stages: dict[str, EnvironmentStage] = {}
        for stage_settings in stages:
            stage = EnvironmentStage(self, stage_settings)
            pre = []
            if stage_settings.name == config.approval_before:
                pre.append(pipelines.ManualApprovalStep(
                    f"Promote-to-{stage_settings.name}",
                    comment=f"Deploy to {stage_settings.name}? Earlier stages are deployed and their tests passed."))
            self.pipeline.add_stage(stage, pre=pre)
            self.stages[stage_settings.name] = stage
        self.pipeline.build_pipeline()
        self._acknowledge_generated()
        self._log_artifact_bucket(access_logs)

        cdk.CfnOutput(self, "PipelineName", value=self.pipeline.pipeline.pipeline_name,
                      description="CodePipeline that deploys every environment")

    def _log_artifact_bucket(self, access_logs: s3.Bucket) -> None:
        """Server access logs of CDK Pipelines' artifact bucket (created by the construct, so set on its L1).

        The logs bucket enforces bucket-owner object ownership (ACLs off), so the logging service may deliver
        only through a bucket policy naming the source bucket and account, as CDK's serverAccessLogsBucket
        writes it (https://docs.aws.amazon.com/AmazonS3/latest/userguide/enable-server-access-logging.html).
        """
        prefix = "pipeline-artifacts/"
        artifacts = self.pipeline.pipeline.artifact_bucket
        bucket = artifacts.node.default_child
        bucket.logging_configuration = s3.CfnBucket.LoggingConfigurationProperty(
            destination_bucket_name=access_logs.bucket_name, log_file_prefix=prefix)
        access_logs.add_to_resource_policy(iam.PolicyStatement(
            sid="S3ServerAccessLogsPolicy",
            principals=[iam.ServicePrincipal("logging.s3.amazonaws.com")],
            actions=["s3:PutObject"],
            resources=[access_logs.arn_for_objects(f"{prefix}*")],
            conditions={"ArnLike": {"aws:SourceArn": artifacts.bucket_arn},
                        "StringEquals": {"aws:SourceAccount": self.account}}))

    def _acknowledge_generated(self) -> None:
        """CDK Pipelines' own roles, whose grants CDK generates: each wildcard named, with why it is there."""
        region = self.region
        account = "<AWS::AccountId>" if cdk.Token.is_unresolved(self.account) else self.account
        by_path = {c.node.path.removeprefix(self.node.path + "/"): c for c in self.node.find_all()}
        logical = {name: self.get_logical_id(by_path[path].node.default_child) for name, path in {
            "artifacts": "Pipeline/Pipeline/ArtifactsBucket",
            "synth": "Pipeline/Pipeline/Build/Synth/CdkBuildProject",
            "mutation": "Pipeline/UpdatePipeline/SelfMutation",
        }.items()}
        reasons = {
            **dict.fromkeys([f"Action::{a}" for a in ("s3:List*", "s3:GetObject*", "s3:GetBucket*",
                                                      "s3:DeleteObject*", "s3:Abort*")],
                            "CDK's bucket grants for the pipeline's own artifact bucket."),
            **dict.fromkeys(["Action::kms:ReEncrypt*", "Action::kms:GenerateDataKey*"],
                            "CDK's key grants for the pipeline's own artifact key."),
            f"Resource::<{logical['artifacts']}.Arn>/*": "Pipeline stages read and write any artifact they produce.",
            "Resource::*": "codestar-connections:UseConnection and CodeBuild batch actions CDK grants unscoped.",
            f"Resource::arn:aws:logs:{region}:{account}:log-group:/aws/codebuild/<{logical['synth']}>:*":
                "Log streams of the synth project's own log group.",
            f"Resource::arn:aws:logs:{region}:{account}:log-group:/aws/codebuild/<{logical['mutation']}>:*":
                "Log streams of the self-mutation project's own log group.",
            f"Resource::arn:aws:logs:{region}:{account}:log-group:/aws/codebuild/*":
                "Asset publishing projects have generated names.",
            f"Resource::arn:aws:codebuild:{region}:{account}:report-group/<{logical['synth']}>-*":
                "Report groups of the synth project.",
            f"Resource::arn:aws:codebuild:{region}:{account}:report-group/<{logical['mutation']}>-*":
                "Report groups of the self-mutation project.",
            f"Resource::arn:aws:codebuild:{region}:{account}:report-group/*":
                "Asset publishing projects have generated names.",
            f"Resource::arn:*:iam::{account}:role/*":
                "Self-mutation assumes the CDK bootstrap roles (cdk-*), whose names carry the qualifier.",
        }
        for finding, reason in reasons.items():
            acknowledge(self, f"IAM5[{finding}]", reason)
        acknowledge(by_path["Pipeline/Pipeline/ArtifactsBucket"],
                    (*compliance("S3BucketReplicationEnabled"), *compliance("S3BucketVersioningEnabled")),
                    "CDK Pipelines' working bucket: every run rebuilds its artifacts from the source commit")
        for project in self.node.find_all():
            if isinstance(project, codebuild.CfnProject):
                acknowledge(project, compliance("CodeBuildProjectSourceRepoUrl"),
                            "CDK Pipelines' projects take their source from CodePipeline artifacts (type "
                            "CODEPIPELINE), not a repository URL that could carry credentials")
