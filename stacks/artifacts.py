"""The project's KMS key and the artifact bucket every other stack reads from or writes to."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from constructs import Construct

from settings import Settings
from settings.network import ArtifactSettings
from stacks.base import EnvironmentStack
from stacks.nag import acknowledge, compliance

NO_REPLICATION = ("one region by design: versioned and retained on stack deletion; a replica in a second region is a "
                  "disaster-recovery choice (and cost) left to the operator")


class ArtifactsStack(EnvironmentStack):
    """Key and buckets outlive the stack: models and logs are worth more than the stack that made them."""

    def __init__(self, scope: Construct, *, settings: Settings) -> None:
        super().__init__(scope, "artifacts", settings=settings, description="KMS key and artifact bucket")
        self.key = self._key(settings)
        self.log_bucket = self._log_bucket(settings.artifacts)
        self.bucket = self._artifact_bucket(settings.artifacts)
        # One topic per environment for every alarm; subscriptions are added by whoever operates it.
        self.alarm_topic = sns.Topic(self, "Alarms", master_key=self.key, enforce_ssl=True,
                                     display_name=f"{settings.stack_prefix} alarms")

        cdk.CfnOutput(self, "ArtifactBucketName", value=self.bucket.bucket_name,
                      description="Artifact bucket: models/, training logs and checkpoints")
        # A named export, so consumers' IAM resources (and the cdk-nag findings naming them) read the same
        # in every synth; see objects_arn().
        self.bucket_arn_export = f"{settings.stack_prefix}-artifact-bucket-arn"
        cdk.CfnOutput(self, "ArtifactBucketArn", value=self.bucket.bucket_arn, export_name=self.bucket_arn_export,
                      description="ARN of the artifact bucket")
        cdk.CfnOutput(self, "KeyArn", value=self.key.key_arn, description="KMS key for artifacts and logs")
        cdk.CfnOutput(self, "AlarmTopicArn", value=self.alarm_topic.topic_arn,
                      description="SNS topic every alarm of this environment notifies")
        cdk.CfnOutput(self, "AccessLogBucketName", value=self.log_bucket.bucket_name,
                      description="Server access logs of the artifact bucket")

    def _key(self, settings: Settings) -> kms.Key:
        key = kms.Key(
            self, "Key",
            description=f"{settings.stack_prefix}: artifacts, logs, alarms and endpoint volumes",
            enable_key_rotation=True,
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        # CloudWatch Logs encrypts this environment's log groups (flow logs, training, lambdas) with the key.
        key.add_to_resource_policy(iam.PolicyStatement(
            principals=[iam.ServicePrincipal(f"logs.{self.region}.amazonaws.com")],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
            resources=["*"],
            conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn":
                                    f"arn:{self.partition}:logs:{self.region}:{self.account}:log-group:*"}},
        ))
        # EventBridge publishes to the encrypted alarm topic (ECR scan results) and writes its dead-letter queues.
        key.add_to_resource_policy(iam.PolicyStatement(
            principals=[iam.ServicePrincipal("events.amazonaws.com")],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"],
            resources=["*"],
            conditions={"StringEquals": {"aws:SourceAccount": self.account}},
        ))
        # CloudWatch alarms publish to the encrypted alarm topic.
        key.add_to_resource_policy(iam.PolicyStatement(
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"],
            resources=["*"],
            conditions={"StringEquals": {"aws:SourceAccount": self.account}},
        ))
        return key

    def _log_bucket(self, config: ArtifactSettings) -> s3.Bucket:
        # S3 server access logs cannot be delivered to an SSE-KMS bucket, so this one uses SSE-S3.
        bucket = s3.Bucket(
            self, "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(
                expiration=cdk.Duration.days(config.access_log_expiration_days),
                noncurrent_version_expiration=cdk.Duration.days(1),
            )],
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        acknowledge(bucket, compliance("S3DefaultEncryptionKMS"),
                    "S3 delivers server access logs only to SSE-S3 buckets, not SSE-KMS")
        acknowledge(bucket, compliance("S3BucketReplicationEnabled"), NO_REPLICATION)
        return bucket

    def _artifact_bucket(self, config: ArtifactSettings) -> s3.Bucket:
        bucket = s3.Bucket(
            self, "Artifacts",
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.log_bucket,
            server_access_logs_prefix="artifacts/",
            lifecycle_rules=[s3.LifecycleRule(
                noncurrent_version_expiration=cdk.Duration.days(config.noncurrent_version_expiration_days),
                abort_incomplete_multipart_upload_after=cdk.Duration.days(7),
            )],
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        # The operations stack reacts to a run's _SUCCESS marker through EventBridge. Set natively rather than
        # with event_bridge_enabled=True, which would add a custom-resource Lambda for the same switch.
        acknowledge(bucket, compliance("S3BucketReplicationEnabled"), NO_REPLICATION)
        cfn_bucket = bucket.node.default_child
        cfn_bucket.notification_configuration = s3.CfnBucket.NotificationConfigurationProperty(
            event_bridge_configuration=s3.CfnBucket.EventBridgeConfigurationProperty(event_bridge_enabled=True))
        return bucket

    def objects_arn(self, key_prefix: str) -> str:
        """ARN of the objects under `key_prefix` (e.g. "models/sentiment/"), for a consumer stack's IAM policy."""
        return f"{cdk.Fn.import_value(self.bucket_arn_export)}/{key_prefix}*"

    def objects_finding(self, key_prefix: str) -> str:
        """The cdk-nag IAM5 finding id that objects_arn(key_prefix) raises, to acknowledge it by name."""
        return f"IAM5[Resource::{self.bucket_arn_export}/{key_prefix}*]"
