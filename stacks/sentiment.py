"""The sentiment model on a Graviton SageMaker endpoint, updated blue/green with canary traffic and rollback.

The endpoint runs our serving image: built from inference/sentiment/image/Dockerfile for linux/arm64 by the CDK app
(a DockerImageAsset, so `cdk deploy` and the pipeline both build and push it), with our server and its batching. The
retired TorchServe image (`sentiment.runtime=dlc`) is gone since issue 43; the same logical ids carry an environment
deployed with it over to this image.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as events_targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from inference.sentiment import container as inference_container
from settings import Settings, SettingsError
from settings.serving import SentimentSettings
from stacks.base import EnvironmentStack, endpoint_log_group
from stacks.instances import vcpus
from stacks.nag import acknowledge

# Graviton families SageMaker hosts (m7g and r7g are not offered for hosting).
GRAVITON_FAMILIES = ("c6g", "c7g", "c8g", "m6g", "r6g")
VARIANT = "AllTraffic"
# Time a blue/green update may spend creating and health-checking the new fleet, on top of its waits.
PROVISIONING_ALLOWANCE_S = 1800
# MaximumExecutionTimeoutInSeconds range in the SageMaker API (botocore service model, shape of that name).
MAX_EXECUTION_TIMEOUT_RANGE_S = (600, 28800)


# ProductionVariant.ContainerStartupHealthCheckTimeoutInSeconds allows 60-3600 s (CreateEndpointConfig API reference).
STARTUP_HEADROOM_S = 300
MAX_STARTUP_HEALTH_CHECK_S = 3600

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVING_DOCKERFILE = "inference/sentiment/image/Dockerfile"
# The image's build context is the repository root; only these reach it (and the asset's fingerprint), as in
# inference/sentiment/image/Dockerfile.dockerignore.
SERVING_IMAGE_CONTEXT = ["*", "!common/__init__.py", "!common/library_warnings.py", "!inference/__init__.py",
                         "!inference/sentiment/", "!training/data/sample/validation.jsonl",
                         "!training/data/sample/test.jsonl", "**/__pycache__", "**/*.pyc"]
# The CDK bootstrap's container-assets repositories (cdk-<qualifier>-container-assets-<account>-<region>).
ASSET_REPOSITORY_FILTER = "cdk-*-container-assets-*"
# How the image leaves `docker build` (cdk-assets passes each entry as `--output=<entry>`, then tags and pushes the
# local image): loaded into the local image store with Docker media types, so the push is one Docker v2 schema 2
# manifest for linux/arm64, never an OCI image index, which SageMaker's CreateModel has refused. Provenance
# attestations (the other way to get an index; BuildKit turns OCI media types back on for them) are off: the pinned
# CDK CLI's cdk-assets sets BUILDX_NO_DEFAULT_ATTESTATIONS=1 for its `docker build` (tests/test_sentiment_stack.py
# reads that in its source), and the pipeline's asset projects set it in their environment (stacks/pipeline.py).
SERVING_IMAGE_OUTPUTS = ["type=docker,oci-mediatypes=false"]


def serving_image(scope: Construct) -> ecr_assets.DockerImageAsset:
    """Our serving image, built for linux/arm64 only and pushed to the bootstrap's container-assets repository as a
    single-platform Docker manifest without attestations (what SageMaker hosting accepts)."""
    return ecr_assets.DockerImageAsset(
        scope, "ServingImage",
        directory=str(REPO_ROOT),
        file=SERVING_DOCKERFILE,
        platform=ecr_assets.Platform.LINUX_ARM64,
        outputs=SERVING_IMAGE_OUTPUTS,
        exclude=SERVING_IMAGE_CONTEXT,
        ignore_mode=cdk.IgnoreMode.DOCKER,
    )


@functools.cache
def serving_image_tag() -> str:
    """The tag the serving image gets: the asset's content hash, computed exactly as for the sentiment stack, in a
    scratch app that is never synthesized, so no other stack's assets include (and build) the arm64 image."""
    with tempfile.TemporaryDirectory(prefix="serving-image-tag-") as outdir:
        return serving_image(cdk.Stack(cdk.App(outdir=outdir), "ServingImageTag")).asset_hash


def serving_image_uri(stack: cdk.Stack) -> str:
    """Where the sentiment stack of this code pushes the serving image (the bootstrap's container-assets repository
    of `stack`'s account and region, tagged with the content hash), for stacks that record the image without
    building it: model registration. The tag exists once the sentiment stack (or the pipeline's asset stage) has
    published this code's image."""
    qualifier = stack.synthesizer.bootstrap_qualifier or cdk.DefaultStackSynthesizer.DEFAULT_QUALIFIER
    repository = f"cdk-{qualifier}-container-assets-{stack.account}-{stack.region}"
    return f"{stack.account}.dkr.ecr.{stack.region}.{stack.url_suffix}/{repository}:{serving_image_tag()}"


def server_environment(config: SentimentSettings) -> dict[str, str]:
    """Our server's settings (inference/sentiment/server/config.py reads them; `make serve-local` has the same)."""
    return inference_container.server_environment(
        vcpus=vcpus(config.instance_type), workers=config.workers, max_batch=config.max_batch,
        max_batch_size=config.max_batch_size, max_batch_wait_ms=config.max_batch_wait_ms,
        max_queue=config.max_queue, precision=config.precision, max_batch_tokens=config.max_batch_tokens,
        max_queue_tokens=config.max_queue_tokens, request_timeout_ms=config.request_timeout_ms,
        drain_seconds=config.drain_seconds, calibration_seconds=config.calibration_seconds)


def startup_health_check_timeout(config: SentimentSettings) -> int:
    """Seconds SageMaker waits from container start for /ping to answer 200: the server's start-up calibration
    (its budget, sentiment.calibration_seconds, in which it chooses the engine and precision on the serving CPU)
    plus STARTUP_HEADROOM_S for the imports and loading the model (SageMaker has downloaded and extracted it)."""
    return min(MAX_STARTUP_HEALTH_CHECK_S, config.calibration_seconds + STARTUP_HEADROOM_S)


def check(config: SentimentSettings) -> None:
    """What the endpoint would only discover after a paid wait."""
    family = config.instance_type.split(".")[1]
    if family not in GRAVITON_FAMILIES:
        raise SettingsError("sentiment.instance_type", config.instance_type,
                            "a Graviton hosting type (arm64 image): ml.<family>.<size> with family one of "
                            + ", ".join(GRAVITON_FAMILIES))
    if config.workers > vcpus(config.instance_type):
        raise SettingsError("sentiment.workers", config.workers,
                            f"at most the {vcpus(config.instance_type)} vCPUs of {config.instance_type}")


def canary_instances(config: SentimentSettings) -> int | None:
    """Instances of the canary step, or None where the fleet is too small for one.

    SageMaker requires a canary of at most 50% of the variant's instances (API reference, TrafficRoutingConfig
    CanarySize), so a fleet of one has no canary. The canary is counted in instances: the fleet never shrinks
    below min_instances (autoscaling's minimum, and the initial count an update starts from).
    """
    fleet = config.min_instances
    size = max(1, fleet * config.canary_percent // 100)
    return size if 2 * size <= fleet else None


def blue_green_policy(config: SentimentSettings) -> sagemaker.CfnEndpoint.BlueGreenUpdatePolicyProperty:
    """Canary then the rest where the fleet allows it, else all at once; alarms watched for bake_minutes.

    The deployment's timeout must exceed its waits (wait interval plus termination wait, API reference,
    BlueGreenUpdatePolicy) and leave time to provision the new fleet.
    """
    bake = config.bake_minutes * 60
    canary = canary_instances(config)
    if canary is None:
        routing = sagemaker.CfnEndpoint.TrafficRoutingConfigProperty(type="ALL_AT_ONCE", wait_interval_in_seconds=bake)
    else:
        routing = sagemaker.CfnEndpoint.TrafficRoutingConfigProperty(
            type="CANARY", wait_interval_in_seconds=bake,
            canary_size=sagemaker.CfnEndpoint.CapacitySizeProperty(type="INSTANCE_COUNT", value=canary))
    timeout = PROVISIONING_ALLOWANCE_S + 2 * bake
    low, high = MAX_EXECUTION_TIMEOUT_RANGE_S
    if not low <= timeout <= high:
        raise SettingsError("sentiment.bake_minutes", config.bake_minutes,
                            f"a bake time whose deployment timeout ({timeout} s) lies within {low}-{high} s")
    return sagemaker.CfnEndpoint.BlueGreenUpdatePolicyProperty(
        traffic_routing_configuration=routing, termination_wait_in_seconds=bake,
        maximum_execution_timeout_in_seconds=timeout)


def _s3_object_arn(partition: str, url: str) -> str:
    bucket, key = url.removeprefix("s3://").split("/", 1)
    return f"arn:{partition}:s3:::{bucket}/{key}"


class SentimentStack(EnvironmentStack):
    def __init__(self, scope: Construct, *, settings: Settings, vpc: ec2.IVpc, key: kms.IKey,
                 alarm_topic: sns.ITopic) -> None:
        super().__init__(scope, "sentiment", settings=settings,
                         description=f"Sentiment endpoint on {settings.sentiment.instance_type}")
        config = settings.sentiment
        check(config)
        self.endpoint_name = f"{settings.name}-sentiment"
        self.serving_image = serving_image(self)
        self._image_scanning(config, alarm_topic, key)
        log_group_arn = (f"arn:{self.partition}:logs:{self.region}:{self.account}:"
                         f"log-group:/aws/sagemaker/Endpoints/{self.endpoint_name}")

        role = iam.Role(self, "ExecutionRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
                        description=f"{self.endpoint_name}: read the model, pull the image, write logs")
        security_group = ec2.SecurityGroup(
            self, "ModelSecurityGroup", vpc=vpc, allow_all_outbound=False,
            description="Sentiment model: no inbound; HTTPS out for the model download through the VPC")
        security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "model artifact download from S3")

        model = sagemaker.CfnModel(
            self, "Model",
            execution_role_arn=role.role_arn,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=self.serving_image.image_uri,
                model_data_url=config.model_data_url,
                environment=server_environment(config),
            ),
            enable_network_isolation=True,
            vpc_config=sagemaker.CfnModel.VpcConfigProperty(
                subnets=vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnet_ids,
                security_group_ids=[security_group.security_group_id],
            ),
        )
        # The role's policy must exist before SageMaker validates the model against it.
        model.node.add_dependency(role)
        endpoint_config = sagemaker.CfnEndpointConfig(
            self, "EndpointConfig",
            kms_key_id=key.key_arn,
            production_variants=[sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                variant_name=VARIANT,
                model_name=model.attr_model_name,
                initial_instance_count=config.min_instances,
                instance_type=config.instance_type,
                container_startup_health_check_timeout_in_seconds=startup_health_check_timeout(config),
            )],
        )
        alarms = self._alarms(config, alarm_topic)
        self.autoscaled = config.autoscaling and config.max_instances > config.min_instances
        self.endpoint = sagemaker.CfnEndpoint(
            self, "Endpoint",
            endpoint_name=self.endpoint_name,
            endpoint_config_name=endpoint_config.attr_endpoint_config_name,
            # Keep the instance count autoscaling has reached across updates; without autoscaling, an update
            # takes the count from the new config (min_instances). SageMaker API reference, UpdateEndpoint.
            retain_all_variant_properties=True,
            exclude_retained_variant_properties=None if self.autoscaled else [
                sagemaker.CfnEndpoint.VariantPropertyProperty(variant_property_type="DesiredInstanceCount")],
            deployment_config=sagemaker.CfnEndpoint.DeploymentConfigProperty(
                blue_green_update_policy=blue_green_policy(config),
                auto_rollback_configuration=sagemaker.CfnEndpoint.AutoRollbackConfigProperty(
                    alarms=[sagemaker.CfnEndpoint.AlarmProperty(alarm_name=a.alarm_name) for a in alarms],
                ),
            ),
        )
        log_group = endpoint_log_group(self, self.endpoint_name, key=key,
                                       retention_days=settings.operations.endpoint_log_retention_days)
        self.endpoint.node.add_dependency(log_group)
        if self.autoscaled:
            self._autoscaling(config)

        self._grant(role, image_repository_arn=self.serving_image.repository.repository_arn,
                    model_data_url=config.model_data_url or "",
                    key=key, log_group_arn=log_group_arn)

        cdk.CfnOutput(self, "EndpointName", value=self.endpoint_name, description="Sentiment endpoint")
        cdk.CfnOutput(self, "PredictCommand",
                      value=(f"python -m inference.sentiment.predict --endpoint {self.endpoint_name} "
                             f"--region {self.region} "
                             "'Covid cases are increasing fast!'"),
                      description="Try the endpoint")
        cdk.CfnOutput(self, "LogGroupName", value=f"/aws/sagemaker/Endpoints/{self.endpoint_name}",
                      description="Endpoint container logs")

    def _image_scanning(self, config: SentimentSettings, topic: sns.ITopic, key: kms.IKey) -> None:
        """ECR basic scanning on push for the container-assets repository, and its findings to the alarm topic.

        The bootstrap template creates that repository without scanning, so the registry's scanning rule turns
        it on (one rule set per registry: `sentiment.image_scan_on_push=false` in the other environments of a
        shared account and region). Each completed scan of this image's tag sends its severity counts to the
        alarm topic; the output names the command that lists the findings.
        """
        asset = self.serving_image
        if config.image_scan_on_push:
            ecr.CfnRegistryScanningConfiguration(
                self, "ScanOnPush", scan_type="BASIC",
                rules=[ecr.CfnRegistryScanningConfiguration.ScanningRuleProperty(
                    scan_frequency="SCAN_ON_PUSH",
                    repository_filters=[ecr.CfnRegistryScanningConfiguration.RepositoryFilterProperty(
                        filter=ASSET_REPOSITORY_FILTER, filter_type="WILDCARD")])])
        findings = events.Rule(
            self, "ImageScanFindings",
            description=f"{self.endpoint_name}: ECR scan results of the serving image to the alarm topic",
            event_pattern=events.EventPattern(
                source=["aws.ecr"], detail_type=["ECR Image Scan"],
                detail={"repository-name": [asset.repository.repository_name], "image-tags": [asset.asset_hash],
                        "scan-status": ["COMPLETE"]}))
        # Events EventBridge cannot deliver (after its retries) wait here, and an alarm says so, as for every rule.
        undelivered = sqs.Queue(self, "ImageScanFindingsDeadLetters", encryption=sqs.QueueEncryption.KMS,
                                encryption_master_key=key, enforce_ssl=True, retention_period=cdk.Duration.days(14))
        acknowledge(undelivered, ("Serverless-SQSRedrivePolicy", "SQS3"),
                    "it is itself a dead-letter queue (of an EventBridge target, which cdk-nag does not trace)")
        findings.add_target(events_targets.SnsTopic(topic, message=events.RuleTargetInput.from_text(
            f"{self.endpoint_name} serving image {asset.asset_hash[:12]}: ECR scan finding counts "
            f"{events.EventField.from_path('$.detail.finding-severity-counts')}"),
            dead_letter_queue=undelivered, retry_attempts=4, max_event_age=cdk.Duration.hours(6)))
        cloudwatch.Alarm(
            self, "ImageScanFindingsUndelivered",
            metric=undelivered.metric_approximate_number_of_messages_visible(period=cdk.Duration.minutes(5)),
            threshold=1, evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{self.endpoint_name}: ECR scan results EventBridge could not deliver",
        ).add_alarm_action(cw_actions.SnsAction(topic))
        cdk.CfnOutput(self, "ImageScanFindingsCommand", description="List the serving image's scan findings",
                      value=(f"aws ecr describe-image-scan-findings --region {self.region} --repository-name "
                             f"{asset.repository.repository_name} --image-id imageTag={asset.asset_hash}"))

    def _alarms(self, config: SentimentSettings, topic: sns.ITopic) -> list[cloudwatch.Alarm]:
        """5xx errors and p90 model latency: they notify, and roll back a deployment while it bakes."""
        dimensions = {"EndpointName": self.endpoint_name, "VariantName": VARIANT}
        errors = cloudwatch.Alarm(
            self, "Errors5xx",
            metric=cloudwatch.Metric(namespace="AWS/SageMaker", metric_name="Invocation5XXErrors",
                                     dimensions_map=dimensions, statistic="Sum", period=cdk.Duration.minutes(1)),
            threshold=1, evaluation_periods=2, datapoints_to_alarm=2,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{self.endpoint_name}: 5xx errors on two consecutive minutes",
        )
        latency = cloudwatch.Alarm(
            self, "LatencyP90",
            # ModelLatency is reported in microseconds.
            metric=cloudwatch.Metric(namespace="AWS/SageMaker", metric_name="ModelLatency",
                                     dimensions_map=dimensions, statistic="p90", period=cdk.Duration.minutes(1)),
            threshold=config.latency_alarm_ms * 1000, evaluation_periods=3, datapoints_to_alarm=3,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{self.endpoint_name}: p90 model latency above {config.latency_alarm_ms} ms",
        )
        for alarm in (errors, latency):
            alarm.add_alarm_action(cw_actions.SnsAction(topic))
        return [errors, latency]

    def _autoscaling(self, config: SentimentSettings) -> None:
        # Application Auto Scaling's service-linked role already holds exactly the SageMaker permissions it needs.
        service_linked_role = iam.Role.from_role_arn(
            self, "ScalingRole",
            f"arn:{self.partition}:iam::{self.account}:role/aws-service-role/"
            "sagemaker.application-autoscaling.amazonaws.com/AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint",
            mutable=False)
        target = appscaling.ScalableTarget(
            self, "ScalableTarget",
            role=service_linked_role,
            service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            resource_id=f"endpoint/{self.endpoint_name}/variant/{VARIANT}",
            scalable_dimension="sagemaker:variant:DesiredInstanceCount",
            min_capacity=config.min_instances, max_capacity=config.max_instances,
        )
        target.node.add_dependency(self.endpoint)
        target.scale_to_track_metric(
            "InvocationsPerInstance",
            predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_VARIANT_INVOCATIONS_PER_INSTANCE,
            target_value=config.invocations_per_instance,
            scale_in_cooldown=cdk.Duration.minutes(5), scale_out_cooldown=cdk.Duration.minutes(1),
        )

    def _grant(self, role: iam.Role, *, image_repository_arn: str, model_data_url: str, key: kms.IKey,
               log_group_arn: str) -> None:
        """Exactly what hosting needs: the model object, the key, the image, its logs, metrics, VPC, alarms."""
        statements = [
            iam.PolicyStatement(sid="ReadModel", actions=["s3:GetObject"],
                                resources=[_s3_object_arn(self.partition, model_data_url)]),
            iam.PolicyStatement(sid="DecryptModel", actions=["kms:Decrypt"], resources=[key.key_arn],
                                conditions={"StringEquals": {"kms:ViaService": f"s3.{self.region}.amazonaws.com"}}),
            iam.PolicyStatement(sid="PullImage", resources=[image_repository_arn],
                                actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                                         "ecr:BatchCheckLayerAvailability"]),
            iam.PolicyStatement(sid="RegistryLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
            iam.PolicyStatement(sid="WriteLogs", resources=[f"{log_group_arn}:*"],
                                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                                         "logs:DescribeLogStreams"]),
            iam.PolicyStatement(sid="PutMetrics", actions=["cloudwatch:PutMetricData"], resources=["*"],
                                conditions={"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/*"}}),
            iam.PolicyStatement(sid="ReadRollbackAlarms", actions=["cloudwatch:DescribeAlarms"], resources=["*"]),
            iam.PolicyStatement(sid="VpcAccess", resources=["*"], actions=[
                "ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface",
                "ec2:DeleteNetworkInterfacePermission", "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs",
                "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"]),
        ]
        for statement in statements:
            role.add_to_policy(statement)
        acknowledge(role, "IAM5[Resource::*]",
                    "ecr:GetAuthorizationToken, PutMetricData (namespace-scoped), DescribeAlarms and the VPC "
                    "network-interface actions SageMaker performs have no resource-level scope.")
        partition = "<AWS::Partition>" if cdk.Token.is_unresolved(self.partition) else self.partition
        account = "<AWS::AccountId>" if cdk.Token.is_unresolved(self.account) else self.account
        acknowledge(role, f"IAM5[Resource::arn:{partition}:logs:{self.region}:{account}:log-group:"
                    f"/aws/sagemaker/Endpoints/{self.endpoint_name}:*]",
                    "Log streams of this endpoint's own log group are created per instance.")
