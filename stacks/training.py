"""One paid training run: a GPU instance from the Deep Learning Base AMI (Amazon Linux 2023) whose user data builds
the training image on AWS's Amazon Linux 2023 PyTorch image, trains and terminates."""

from __future__ import annotations

import shlex
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from settings import REPO_ROOT, Settings, SettingsError
from settings.training import TrainingSettings
from stacks.artifacts import ArtifactsStack
from stacks.base import EnvironmentStack, log_retention
from stacks.images import UnsupportedRegionError, dlc_image_uri, dlc_registry, dlc_repository_arn
from stacks.instances import NVME_MOUNT, has_instance_storage
from stacks.nag import acknowledge

USER_DATA_SCRIPT = REPO_ROOT / "training" / "ec2" / "run_training.sh"
# AWS's Amazon Linux 2023 PyTorch training images (settings.training.EC2_IMAGE_TAGS).
TRAINING_REPOSITORY = "pytorch"
MODEL_PREFIX = "models/sentiment"
# Code the instance needs, shipped as CDK assets; caches and build output stay behind.
_ASSET_EXCLUDES = ["__pycache__", "*.pyc", ".pytest_cache", "model", "checkpoints", "*.tar.gz"]


def train_args(config: TrainingSettings) -> str:
    """The recipe's trainer flags, from the settings (the container's defaults cover the rest)."""
    args = [
        "--model-name-or-path", shlex.quote(config.base_model),
        "--num-train-epochs", str(config.epochs),
        "--learning-rate", repr(config.learning_rate),
        "--per-device-train-batch-size", str(config.per_device_batch_size),
        "--per-device-eval-batch-size", str(config.per_device_batch_size),
        "--max-length", str(config.max_length),
    ]
    if config.max_train_samples:
        args += ["--max-train-samples", str(config.max_train_samples)]
    if config.max_eval_samples:
        args += ["--max-eval-samples", str(config.max_eval_samples)]
    return " ".join(args)


def root_device_name(ami_parameter: str) -> str:
    """The root volume's device name for the AMI family: Amazon Linux AMIs boot from /dev/xvda, Ubuntu DLAMIs from
    /dev/sda1. A mapping under another name adds a second volume and leaves the root at the AMI's own size and key."""
    return "/dev/xvda" if "amazon-linux" in ami_parameter else "/dev/sda1"


def render_user_data(values: dict[str, str], script: Path = USER_DATA_SCRIPT) -> str:
    """The readable script under training/ec2, with the run's values exported in front of it."""
    body = script.read_text()
    assert body.startswith("#!"), f"{script} must start with a shebang"
    exports = "\n".join(f"export {name}={shlex.quote(value)}" for name, value in values.items())
    first_line, rest = body.split("\n", 1)
    return f"{first_line}\n# --- values rendered by the training stack ---\n{exports}\n{rest}"


def training_subnets(settings: Settings) -> ec2.SubnetSelection:
    """The private subnet in training.availability_zone, or the first private subnet when none is set."""
    zone, zones = settings.training.availability_zone, settings.network.availability_zones
    if zone is None:
        if settings.training.capacity_reservation_id:
            raise SettingsError("training.availability_zone", zone,
                                "the zone of training.capacity_reservation_id (a reservation holds one zone)")
        return ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
    if zone not in zones:
        raise SettingsError("training.availability_zone", zone,
                            "one of network.availability_zones (" + (", ".join(zones) or "unset: set them too") + ")")
    return ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, availability_zones=[zone])


class TrainingStack(EnvironmentStack):
    def __init__(self, scope: Construct, *, settings: Settings, vpc: ec2.IVpc, artifacts: ArtifactsStack) -> None:
        super().__init__(scope, "training", settings=settings,
                         description=f"Training run {settings.training.run_id} on {settings.training.instance_type}")
        config = settings.training
        key, bucket = artifacts.key, artifacts.bucket
        self.add_stack_dependency(artifacts, "imports the artifact bucket ARN by export name")
        try:
            base_image = dlc_image_uri(self.region, TRAINING_REPOSITORY, config.base_image_tag)
            registry = dlc_registry(self.region)
            repository_arn = dlc_repository_arn(self.region, TRAINING_REPOSITORY)
        except UnsupportedRegionError as error:
            raise SettingsError("region", settings.region, "a region with Deep Learning Containers") from error
        subnets = training_subnets(settings)

        self.log_group = logs.LogGroup(
            self, "Logs", encryption_key=key, retention=log_retention(config.log_retention_days),
            removal_policy=cdk.RemovalPolicy.RETAIN)
        training_code = s3_assets.Asset(self, "TrainingCode", path=str(REPO_ROOT / "training"),
                                        exclude=_ASSET_EXCLUDES)
        inference_code = s3_assets.Asset(self, "InferenceCode", path=str(REPO_ROOT / "inference"),
                                         exclude=_ASSET_EXCLUDES)
        role = iam.Role(self, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                        description="One training run: pull the DLC, read code, write its model prefix and logs")
        security_group = ec2.SecurityGroup(
            self, "InstanceSecurityGroup", vpc=vpc, allow_all_outbound=False,
            description="Training instance: no inbound traffic (Session Manager), HTTPS out for images and data")
        # Registry, S3, CloudWatch, Session Manager and the model hub are all HTTPS (VPC endpoints or NAT).
        security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs and the model hub")

        user_data = ec2.UserData.custom(render_user_data({
            "RUN_ID": config.run_id,
            "BUCKET": bucket.bucket_name,
            "REGION": self.region,
            "DLC_REGISTRY": registry,
            "BASE_IMAGE": base_image,
            "LOG_GROUP": self.log_group.log_group_name,
            "TRAINING_CODE_URL": training_code.s3_object_url,
            "INFERENCE_CODE_URL": inference_code.s3_object_url,
            "MAX_HOURS": str(config.max_hours),
            "TRAIN_ARGS": train_args(config),
            # The sentiment endpoint's instance type: the int8 graph gets the weights its CPU needs.
            "SERVE_ON": settings.sentiment.instance_type,
            **({"NVME_MOUNT": NVME_MOUNT} if has_instance_storage(config.instance_type) else {}),
        }))
        self.instance = ec2.Instance(
            self, "Instance",
            vpc=vpc,
            vpc_subnets=subnets,
            instance_type=ec2.InstanceType(config.instance_type),
            machine_image=ec2.MachineImage.from_ssm_parameter(config.ami_parameter, user_data=user_data),
            user_data=user_data,
            user_data_causes_replacement=True,
            role=role,
            security_group=security_group,
            # IMDSv2 comes from the launch template below, which also carries the capacity reservation.
            require_imdsv2=False,
            detailed_monitoring=True,
            instance_initiated_shutdown_behavior=ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
            block_devices=[ec2.BlockDevice(
                device_name=root_device_name(config.ami_parameter),
                volume=ec2.BlockDeviceVolume.ebs(config.volume_gib, encrypted=True, kms_key=key,
                                                 volume_type=ec2.EbsDeviceVolumeType.GP3,
                                                 delete_on_termination=True),
            )],
        )
        # AWS::EC2::Instance has no capacity reservation property: a launch template does (its zone is
        # training.availability_zone). The same template requires IMDSv2, as require_imdsv2 would.
        reservation = None
        if config.capacity_reservation_id:
            reservation = ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                    capacity_reservation_id=config.capacity_reservation_id))
        template_data = ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
            metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(http_tokens="required",
                                                                           http_endpoint="enabled"),
            capacity_reservation_specification=reservation)
        launch_template = ec2.CfnLaunchTemplate(self, "LaunchTemplate", launch_template_data=template_data)
        self.instance.instance.launch_template = ec2.CfnInstance.LaunchTemplateSpecificationProperty(
            launch_template_id=launch_template.ref, version=launch_template.attr_latest_version_number)
        # The watchdog (stacks/operations.py) finds overdue runs by these tags.
        tags = {"component": "training", "run-id": config.run_id, "max-hours": str(config.max_hours)}
        for tag, value in tags.items():
            cdk.Tags.of(self.instance).add(tag, value)
        acknowledge(self.instance, "EC29",
                    "A one-shot training instance must be able to terminate itself when its run ends.")

        self._grant(role, repository_arn=repository_arn, artifacts=artifacts, assets=[training_code, inference_code],
                    run_id=config.run_id)

        prefix = f"s3://{bucket.bucket_name}/{MODEL_PREFIX}/{config.run_id}/"
        cdk.CfnOutput(self, "InstanceId", value=self.instance.instance_id, description="Training instance")
        cdk.CfnOutput(self, "RunId", value=config.run_id, description="This run's id")
        cdk.CfnOutput(self, "ModelPrefix", value=prefix,
                      description="Where model.tar.gz, metrics.json, training.log and _SUCCESS/_FAILED land")
        cdk.CfnOutput(self, "LogGroupName", value=self.log_group.log_group_name, description="Training logs")
        cdk.CfnOutput(self, "FollowLogCommand",
                      value=f"aws logs tail {self.log_group.log_group_name} --follow --region {self.region}",
                      description="Follow the run's log")

    def _grant(self, role: iam.Role, *, repository_arn: str, artifacts: ArtifactsStack,
               assets: list[s3_assets.Asset], run_id: str) -> None:
        """Everything the instance may do, in one place: pull, read code, write its prefix, log, be reached."""
        run_prefix = f"{MODEL_PREFIX}/{run_id}/"  # the run id is known at synth: no write into other runs
        role.add_to_policy(iam.PolicyStatement(
            sid="PullTrainingImage",
            actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            resources=[repository_arn]))
        role.add_to_policy(iam.PolicyStatement(
            sid="RegistryLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"]))
        # Exactly the two code objects (asset.grant_read would allow List*/GetBucket* on the whole bucket).
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadCode", actions=["s3:GetObject"],
            resources=[f"arn:{self.partition}:s3:::{a.s3_bucket_name}/{a.s3_object_key}" for a in assets]))
        role.add_to_policy(iam.PolicyStatement(
            sid="WriteRunOutputs", actions=["s3:PutObject", "s3:AbortMultipartUpload"],
            resources=[artifacts.objects_arn(run_prefix)]))
        # Multipart uploads to an SSE-KMS bucket need Decrypt as well as GenerateDataKey.
        role.add_to_policy(iam.PolicyStatement(
            sid="EncryptRunOutputs", actions=["kms:GenerateDataKey", "kms:Encrypt", "kms:Decrypt"],
            resources=[artifacts.key.key_arn],
            conditions={"StringEquals": {"kms:ViaService": f"s3.{self.region}.amazonaws.com"}}))
        role.add_to_policy(iam.PolicyStatement(
            sid="WriteLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[self.log_group.log_group_arn]))
        # The minimal instance permissions Session Manager documents, in place of its broad managed policy.
        role.add_to_policy(iam.PolicyStatement(
            sid="SessionManager",
            actions=["ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel",
                     "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel",
                     "ssmmessages:OpenDataChannel"],
            resources=["*"]))
        acknowledge(role, "IAM5[Resource::*]",
                    "ecr:GetAuthorizationToken and the Session Manager channel actions have no resource-level scope.")
        acknowledge(role, artifacts.objects_finding(run_prefix),
                    f"Training writes any object under its own run's prefix {run_prefix} (model, logs, markers).")
