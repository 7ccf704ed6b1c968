"""training.backend=sagemaker: a SageMaker Pipeline per environment that trains, gates on quality and registers.

Creating the pipeline costs nothing; each `make train ENV=...` (training/pipeline_cli.py) starts one execution.
The definition itself is rendered by stacks/sagemaker_training.py.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from settings import REPO_ROOT, Settings, SettingsError
from stacks.artifacts import ArtifactsStack
from stacks.base import EnvironmentStack
from stacks.images import UnsupportedRegionError, dlc_image_uri, dlc_repository_arn
from stacks.nag import acknowledge, compliance
from stacks.sagemaker_training import RUN_PREFIX, TRAINING_REPOSITORY, Resources, pipeline_definition
from stacks.sentiment import server_environment, serving_image_uri

_ASSET_EXCLUDES = ["__pycache__", "*.pyc", ".pytest_cache", "model", "checkpoints", "*.tar.gz"]
SERVICE = "sagemaker.amazonaws.com"


def pipeline_name(settings: Settings) -> str:
    """The pipeline's name, which the CLI derives the same way (`make train ENV=...`)."""
    return f"{settings.stack_prefix}-sentiment-training"


def model_package_group_name(settings: Settings) -> str:
    """The group the operations stack creates (stacks/operations.py)."""
    return f"{settings.stack_prefix}-sentiment"


class SageMakerTrainingStack(EnvironmentStack):
    def __init__(self, scope: Construct, *, settings: Settings, vpc: ec2.IVpc, artifacts: ArtifactsStack) -> None:
        config = settings.training
        super().__init__(scope, "sagemaker-training", settings=settings,
                         description=f"SageMaker Pipeline: {config.instance_count} x {config.sagemaker_instance_type}"
                         f"{' spot' if config.spot else ''} training, quality gate, registration")
        self.add_stack_dependency(artifacts, "imports the artifact bucket ARN by export name")
        try:
            training_image = dlc_image_uri(self.region, TRAINING_REPOSITORY, config.sagemaker_image_tag)
            repository_arn = dlc_repository_arn(self.region, TRAINING_REPOSITORY)
        except UnsupportedRegionError as error:
            raise SettingsError("region", settings.region, "a region with Deep Learning Containers") from error
        key, bucket = artifacts.key, artifacts.bucket

        code = s3_assets.Asset(self, "TrainingCode", path=str(REPO_ROOT / "training"), exclude=_ASSET_EXCLUDES)
        handler = s3_assets.Asset(self, "InferenceCode", path=str(REPO_ROOT / "inference"), exclude=_ASSET_EXCLUDES)
        self.security_group = ec2.SecurityGroup(
            self, "JobSecurityGroup", vpc=vpc, allow_all_outbound=True,
            description="SageMaker training instances: each other (torchrun, NCCL, EFA) and egress only")
        # Multi-node training and EFA need all traffic between the job's instances, inbound and outbound.
        self.security_group.add_ingress_rule(self.security_group, ec2.Port.all_traffic(),
                                             "Between the instances of one training job")
        acknowledge(self.security_group, compliance("EC2RestrictedCommonPorts"),
                    "all ports only from this same group: the job's own instances (NCCL, EFA), nothing else")
        self.training_role = iam.Role(self, "TrainingRole", assumed_by=iam.ServicePrincipal(SERVICE),
                                      description="SageMaker training job: read code, write its run prefix, log")
        self.pipeline_role = iam.Role(self, "PipelineRole", assumed_by=iam.ServicePrincipal(SERVICE),
                                      description="SageMaker Pipeline: start and watch training, register models")

        group = model_package_group_name(settings)
        resources = Resources(
            bucket_name=bucket.bucket_name,
            key_arn=key.key_arn,
            training_role_arn=self.training_role.role_arn,
            security_group_id=self.security_group.security_group_id,
            subnet_ids=[subnet.subnet_id for subnet in vpc.private_subnets],
            code_url=code.s3_object_url,
            handler_url=handler.s3_object_url,
            training_image=training_image,
            # Our serving image and the environment the sentiment stack gives it, so a package deployed from the
            # registry serves as the endpoint does (the image's tag: stacks.sentiment.serving_image_uri).
            inference_image=serving_image_uri(self),
            inference_instance_type=settings.sentiment.instance_type,
            model_package_group=group,
            inference_environment=server_environment(settings.sentiment),
        )
        self.definition = pipeline_definition(config, resources)
        name = pipeline_name(settings)
        self.pipeline = sagemaker.CfnPipeline(
            self, "Pipeline",
            pipeline_name=name,
            pipeline_description=f"Fine-tune {config.base_model} on {config.instance_count} x "
                                 f"{config.sagemaker_instance_type}, register if validation macro recall >= "
                                 f"{config.min_macro_recall:g}",
            role_arn=self.pipeline_role.role_arn,
            pipeline_definition={"PipelineDefinitionBody": cdk.Stack.of(self).to_json_string(self.definition)},
        )

        self._grant_training(artifacts, repository_arn, [code, handler])
        self._grant_pipeline(group, name)
        # Created and deleted while the pipeline's permissions are attached.
        self.pipeline.node.add_dependency(self.pipeline_role.node.find_child("DefaultPolicy"))

        cdk.CfnOutput(self, "PipelineName", value=name, description="Start a run: make train ENV=" + settings.name)
        cdk.CfnOutput(self, "RunPrefix", value=f"{RUN_PREFIX}/",
                      description="Key prefix in the artifact bucket: <execution id>/checkpoints/ (with metrics.json) "
                                  "and jobs/<job>/output/model.tar.gz")
        cdk.CfnOutput(self, "ModelPackageGroupName", value=group, description="Where passing models are registered")

    def _arn(self, resource: str) -> str:
        return f"arn:{self.partition}:sagemaker:{self.region}:{self.account}:{resource}"

    def _grant_training(self, artifacts: ArtifactsStack, repository_arn: str, assets: list[s3_assets.Asset]) -> None:
        """The job's own permissions: pull, read code, its run prefix, logs and metrics, ENIs in the VPC."""
        role = self.training_role
        bucket_arn = cdk.Fn.import_value(artifacts.bucket_arn_export)
        role.add_to_policy(iam.PolicyStatement(
            sid="PullTrainingImage",
            actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            resources=[repository_arn]))
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadCode", actions=["s3:GetObject"],
            resources=[f"arn:{self.partition}:s3:::{a.s3_bucket_name}/{a.s3_object_key}" for a in assets]))
        # S3Prefix channels list their prefix (here: exactly the object key) before downloading.
        role.add_to_policy(iam.PolicyStatement(
            sid="ListCode", actions=["s3:ListBucket"],
            resources=[f"arn:{self.partition}:s3:::{assets[0].s3_bucket_name}"],
            conditions={"StringLike": {"s3:prefix": [a.s3_object_key for a in assets]}}))
        role.add_to_policy(iam.PolicyStatement(
            sid="RunOutputsAndCheckpoints",
            actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
            resources=[artifacts.objects_arn(f"{RUN_PREFIX}/")]))
        role.add_to_policy(iam.PolicyStatement(
            sid="ListCheckpoints", actions=["s3:ListBucket"], resources=[bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{RUN_PREFIX}/*"]}}))
        role.add_to_policy(iam.PolicyStatement(
            sid="UseProjectKey",
            actions=["kms:GenerateDataKey", "kms:Encrypt", "kms:Decrypt", "kms:DescribeKey", "kms:CreateGrant"],
            resources=[artifacts.key.key_arn]))
        role.add_to_policy(iam.PolicyStatement(
            sid="JobLogs", actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                                    "logs:DescribeLogStreams"],
            resources=[f"arn:{self.partition}:logs:{self.region}:{self.account}:log-group:/aws/sagemaker/TrainingJobs:*"]))
        role.add_to_policy(iam.PolicyStatement(
            sid="JobMetrics", actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*", "aws/sagemaker/*"]}}))
        # What SageMaker documents for VPC jobs; these actions take no resource-level scope.
        role.add_to_policy(iam.PolicyStatement(
            sid="RegistryLoginAndVpc",
            actions=["ecr:GetAuthorizationToken", "ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission",
                     "ec2:DeleteNetworkInterface", "ec2:DeleteNetworkInterfacePermission",
                     "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions",
                     "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"],
            resources=["*"]))
        acknowledge(role, "IAM5[Resource::*]", "ecr:GetAuthorizationToken, the EC2 network-interface actions "
                    "SageMaker needs for VPC jobs and cloudwatch:PutMetricData (namespace-conditioned) have no "
                    "resource-level scope.")
        acknowledge(role, artifacts.objects_finding(f"{RUN_PREFIX}/"),
                    "Jobs write their model, checkpoints and metrics under their own prefix, one folder per run.")
        acknowledge(role, self._finding(
                        f"arn:{self.partition}:logs:{self.region}:{self.account}:log-group:/aws/sagemaker/TrainingJobs:*"),
                    "SageMaker names one log stream per job and instance inside its fixed TrainingJobs group.")

    def _grant_pipeline(self, group: str, name: str) -> None:
        """The pipeline's permissions: jobs it names itself (pipelines-*), passing the job role, registering."""
        role = self.pipeline_role
        role.add_to_policy(iam.PolicyStatement(
            sid="RunTrainingJobs",
            actions=["sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob",
                     "sagemaker:AddTags", "sagemaker:ListTags"],
            resources=[self._arn("training-job/pipelines-*")]))
        role.add_to_policy(iam.PolicyStatement(
            sid="PassTrainingRole", actions=["iam:PassRole"], resources=[self.training_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": SERVICE}}))
        role.add_to_policy(iam.PolicyStatement(
            sid="RegisterModels",
            actions=["sagemaker:CreateModelPackage", "sagemaker:DescribeModelPackage", "sagemaker:AddTags"],
            resources=[self._arn(f"model-package-group/{group}"), self._arn(f"model-package/{group}/*")]))
        for resource in ("training-job/pipelines-*", f"model-package/{group}/*"):
            acknowledge(role, self._finding(self._arn(resource)),
                        "The pipeline names each training job pipelines-<id> and each model package version "
                        "itself; the wildcard stays within those names and this environment's group.")

    def _finding(self, arn: str) -> str:
        """cdk-nag's IAM5 finding id for a resource ARN built by _arn (tokens shown as <AWS::...>)."""
        for token, shown in ((self.partition, "<AWS::Partition>"), (self.region, "<AWS::Region>"),
                             (self.account, "<AWS::AccountId>")):
            if cdk.Token.is_unresolved(token):
                arn = arn.replace(token, shown)
        return f"IAM5[Resource::{arn}]"
