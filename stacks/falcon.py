"""Falcon on the LMI (DJL Serving) container: a SageMaker endpoint whose configuration is checked before deploy.

The settings are checked by inference.llm.lmi first: a combination the container or the GPUs cannot run stops synth
with one line, instead of failing at endpoint start after a long, paid wait.
"""

from __future__ import annotations

import sys

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from aws_cdk import custom_resources as cr
from aws_cdk.aws_applicationautoscaling import CfnScalableTarget, CfnScalingPolicy
from constructs import Construct

from inference.llm import lmi
from settings import Settings
from settings.serving import FalconSettings
from stacks.base import EnvironmentStack, endpoint_log_group
from stacks.nag import CUSTOM_RESOURCE_LAMBDA, acknowledge, acknowledge_each, compliance

VARIANT = "AllTraffic"  # stays the same across endpoint configs, so updates and autoscaling keep working
# SageMaker ends a real-time invocation after 60 s; p90 above this means requests are close to timing out.
LATENCY_ALARM_SECONDS = 45
# Target-tracking goal per instance and minute: each batch slot serving ~6 requests a minute (10 s each) at
# about 70% of the slots.
INVOCATIONS_PER_SLOT_MINUTE = 4
# What SageMaker needs to attach the model's network interfaces to the VPC (CreateModel with VpcConfig).
VPC_ACTIONS = ["ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface",
               "ec2:DeleteNetworkInterfacePermission", "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs",
               "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"]


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix/` -> ("bucket", "some/prefix/")."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix


class FalconStack(EnvironmentStack):
    def __init__(self, scope: Construct, *, settings: Settings, vpc: ec2.IVpc, key: kms.IKey,
                 alarm_topic: sns.ITopic) -> None:
        config = settings.falcon
        # Everything that can refuse the settings runs before any construct exists.
        warnings = lmi.check(config)
        image = lmi.image_uri(settings.region, config.lmi_version)
        repository_arn = lmi.repository_arn(settings.region)
        environment = lmi.to_environment(config)
        if config.hf_token_secret:
            # A CloudFormation dynamic reference, resolved when the model is created: the template (and cdk.out)
            # hold the secret's name only. LMI 0.33+ print HF_TOKEN as *** at start (ConfigManager.java).
            environment["HF_TOKEN"] = cdk.SecretValue.secrets_manager(config.hf_token_secret).unsafe_unwrap()
        report = lmi.sizing(config)
        print(f"falcon sizing ({settings.name}):\n{report.format_report()}", file=sys.stderr)
        for warning in warnings:
            print(f"falcon warning: {warning}", file=sys.stderr)

        super().__init__(scope, "falcon", settings=settings,
                         description=f"{config.model_id} on LMI {config.lmi_version}, {config.instance_type}, "
                                     f"{config.batching} batching")
        self.endpoint_name = f"{settings.name}-falcon"
        self.log_group_name = f"/aws/sagemaker/Endpoints/{self.endpoint_name}"

        security_group = self._security_group(vpc, config, settings.network.cidr)
        role = self._role(config, repository_arn=repository_arn, key=key)
        model = sagemaker.CfnModel(
            self, "Model",
            execution_role_arn=role.role_arn,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=image, environment=environment, model_data_source=self._model_data(config)),
            vpc_config=sagemaker.CfnModel.VpcConfigProperty(
                security_group_ids=[security_group.security_group_id],
                subnets=vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnet_ids),
            # Weights from S3 are copied in by SageMaker before start, so the container needs no network.
            # From the hub the container downloads them itself, which isolation would block.
            enable_network_isolation=config.model_s3_uri is not None,
        )
        if config.model_s3_uri is None:
            # checkov's inline form (resource Metadata checkov.skip): the finding stays visible, with its reason.
            model.add_metadata("checkov", {"skip": [{
                "id": "CKV_AWS_370",
                "comment": "hub mode: the container downloads the weights itself; serve from S3 with network "
                           "isolation by staging them (python -m inference.llm.lmi stage, falcon.model_s3_uri)"}]})
        # SageMaker checks at CreateModel that the role can pull the image: the policy must exist first.
        model.node.add_dependency(role.node.find_child("DefaultPolicy"))

        nvme = lmi.has_local_nvme(config.instance_type)
        endpoint_config = sagemaker.CfnEndpointConfig(
            self, "EndpointConfig",
            production_variants=[sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                variant_name=VARIANT,
                model_name=model.attr_model_name,
                instance_type=config.instance_type,
                initial_instance_count=config.min_instances,
                initial_variant_weight=1,
                container_startup_health_check_timeout_in_seconds=config.startup_health_check_timeout_s,
                model_data_download_timeout_in_seconds=config.download_timeout_s,
            )],
            # No endpoint-config KMS key (nor volume size) on instance types with local NVMe storage, which
            # SageMaker encrypts in hardware and for which it rejects KmsKeyId.
            kms_key_id=None if nvme else key.key_arn,
        )
        if nvme:
            acknowledge(endpoint_config, compliance("SageMakerEndpointConfigurationKMSKeyConfigured"),
                        f"{config.instance_type} has local NVMe storage, encrypted in hardware; SageMaker rejects "
                        "KmsKeyId for it")
        autoscaled = config.max_instances > config.min_instances
        endpoint = sagemaker.CfnEndpoint(self, "Endpoint", endpoint_name=self.endpoint_name,
                                         endpoint_config_name=endpoint_config.attr_endpoint_config_name,
                                         # An update keeps the count autoscaling reached (UpdateEndpoint).
                                         retain_all_variant_properties=True if autoscaled else None)
        endpoint.node.add_dependency(endpoint_log_group(
            self, self.endpoint_name, key=key, retention_days=settings.operations.endpoint_log_retention_days))

        self._alarms(alarm_topic)
        if autoscaled:
            self._autoscaling(config, endpoint)

        cdk.CfnOutput(self, "EndpointName", value=endpoint.attr_endpoint_name, description="Falcon endpoint")
        cdk.CfnOutput(self, "InvokeCommand", description="Ask the endpoint (always send max_new_tokens: default 30)",
                      value=(f"aws sagemaker-runtime invoke-endpoint --region {self.region} --endpoint-name "
                             f"{self.endpoint_name} --content-type application/json --cli-binary-format "
                             f"raw-in-base64-out --body '{lmi.request_body(config)}' /dev/stdout"))
        streaming = lmi.streaming_request_body(config)
        if streaming is not None:
            cdk.CfnOutput(self, "InvokeStreamCommand", description="Ask the endpoint, tokens streamed back",
                          value=(f"aws sagemaker-runtime invoke-endpoint-with-response-stream --region {self.region} "
                                 f"--endpoint-name {self.endpoint_name} --content-type application/json "
                                 f"--cli-binary-format raw-in-base64-out --body '{streaming}' /dev/stdout"))
        cdk.CfnOutput(self, "LogGroupName", value=self.log_group_name, description="Container logs")

    def _security_group(self, vpc: ec2.IVpc, config: FalconSettings, cidr: str) -> ec2.SecurityGroup:
        """No inbound (SageMaker reaches the container itself); HTTPS out for what the container fetches."""
        group = ec2.SecurityGroup(self, "ModelSecurityGroup", vpc=vpc, allow_all_outbound=False,
                                  description="Falcon model containers: no inbound, HTTPS out")
        if config.model_s3_uri:
            group.add_egress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(443), "HTTPS to the VPC endpoints")
            # The weights come from S3 through the gateway endpoint, whose route targets S3's public prefix
            # list, not an address in the VPC: the group must allow that list
            # (https://docs.aws.amazon.com/vpc/latest/privatelink/gateway-endpoints.html).
            group.add_egress_rule(ec2.Peer.prefix_list(self._s3_prefix_list_id()), ec2.Port.tcp(443),
                                  "HTTPS to S3 (weights) through the gateway endpoint")
        else:
            group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to the Hugging Face hub via NAT")
        return group

    def _s3_prefix_list_id(self) -> str:
        """The id of this region's AWS-managed S3 prefix list, read at deploy time (synth stays offline).

        CloudFormation has no attribute or parameter type for it, and the id differs per region and partition.
        """
        name = f"com.amazonaws.{self.region}.s3"
        lookup = cr.AwsCustomResource(
            self, "S3PrefixList",
            on_update=cr.AwsSdkCall(
                service="EC2", action="describeManagedPrefixLists",
                parameters={"Filters": [{"Name": "prefix-list-name", "Values": [name]}]},
                physical_resource_id=cr.PhysicalResourceId.of(name),
                output_paths=["PrefixLists.0.PrefixListId"]),
            policy=cr.AwsCustomResourcePolicy.from_statements([iam.PolicyStatement(
                actions=["ec2:DescribeManagedPrefixLists"], resources=["*"])]),
            install_latest_aws_sdk=False,
        )
        acknowledge(lookup, "IAM5[Resource::*]", "ec2:DescribeManagedPrefixLists has no resource-level scope.")
        provider = self.node.find_child("AWS" + cr.AwsCustomResource.PROVIDER_FUNCTION_UUID.replace("-", ""))
        acknowledge(provider, "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                    "AWSLambdaBasicExecutionRole]",
                    "CDK's AwsCustomResource provider writes only its own logs with the basic execution policy.")
        acknowledge_each(provider, {
            **CUSTOM_RESOURCE_LAMBDA,
            ("Serverless-LambdaTracing", "Serverless-LambdaDefaultMemorySize",
             *compliance("CloudWatchLogGroupEncrypted")):
                "CDK's AwsCustomResource provider, whose function and log group CDK shapes; it makes one "
                "DescribeManagedPrefixLists call per deploy and logs nothing secret",
        })
        # CDK generates both a DependsOn and a GetAtt on the provider's role; cfn-lint notes the redundancy.
        provider.node.default_child.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
        return lookup.get_response_field("PrefixLists.0.PrefixListId")

    def _role(self, config: FalconSettings, *, repository_arn: str, key: kms.IKey) -> iam.Role:
        """Pull the LMI image, write the endpoint's logs, attach to the VPC, read the weights: nothing else."""
        role = iam.Role(self, "ExecutionRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
                        description=f"SageMaker execution role of the {self.endpoint_name} endpoint")
        role.add_to_policy(iam.PolicyStatement(
            sid="PullLmiImage",
            actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            resources=[repository_arn]))
        role.add_to_policy(iam.PolicyStatement(sid="RegistryLogin", actions=["ecr:GetAuthorizationToken"],
                                               resources=["*"]))
        log_group_arn = f"arn:{self.partition}:logs:{self.region}:{self.account}:log-group:{self.log_group_name}"
        role.add_to_policy(iam.PolicyStatement(
            sid="EndpointLogs",
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[log_group_arn, f"{log_group_arn}:log-stream:*"]))
        role.add_to_policy(iam.PolicyStatement(sid="VpcNetworkInterfaces", actions=VPC_ACTIONS, resources=["*"]))
        acknowledge(role, "IAM5[Resource::*]",
                    "ecr:GetAuthorizationToken and the EC2 network-interface actions SageMaker needs for VpcConfig "
                    "have no resource-level scope.")
        # cdk-nag names the finding with the account as written in the template (a Ref reads <AWS::AccountId>).
        account = self.account if not cdk.Token.is_unresolved(self.account) else "<AWS::AccountId>"
        log_group_finding = log_group_arn.replace(self.account, account)
        acknowledge(role, f"IAM5[Resource::{log_group_finding}:log-stream:*]",
                    "SageMaker names one log stream per instance and container at run time, in this endpoint's "
                    "own log group.")
        if config.model_s3_uri:
            bucket, prefix = split_s3_uri(config.model_s3_uri)
            objects = f"arn:{self.partition}:s3:::{bucket}/{prefix}*"
            role.add_to_policy(iam.PolicyStatement(sid="ReadWeights", actions=["s3:GetObject"], resources=[objects]))
            role.add_to_policy(iam.PolicyStatement(
                sid="ListWeights", actions=["s3:ListBucket"], resources=[f"arn:{self.partition}:s3:::{bucket}"],
                conditions={"StringLike": {"s3:prefix": [f"{prefix}*"]}}))
            role.add_to_policy(iam.PolicyStatement(
                sid="DecryptWeights", actions=["kms:Decrypt"], resources=[key.key_arn],
                conditions={"StringEquals": {"kms:ViaService": f"s3.{self.region}.amazonaws.com"}}))
            acknowledge(role, f"IAM5[Resource::{objects}]",
                        "The weights are every object under the model_s3_uri prefix (an uncompressed model folder).")
        return role

    def _model_data(self, config: FalconSettings) -> sagemaker.CfnModel.ModelDataSourceProperty | None:
        """Uncompressed weights under an S3 prefix, copied to /opt/ml/model (render() points model_id there)."""
        if not config.model_s3_uri:
            return None
        return sagemaker.CfnModel.ModelDataSourceProperty(s3_data_source=sagemaker.CfnModel.S3DataSourceProperty(
            s3_uri=config.model_s3_uri, s3_data_type="S3Prefix", compression_type="None"))

    def _metric(self, name: str, statistic: str) -> cloudwatch.Metric:
        return cloudwatch.Metric(namespace="AWS/SageMaker", metric_name=name, statistic=statistic,
                                 dimensions_map={"EndpointName": self.endpoint_name, "VariantName": VARIANT},
                                 period=cdk.Duration.minutes(5))

    def _alarms(self, alarm_topic: sns.ITopic) -> None:
        errors = cloudwatch.Alarm(
            self, "ServerErrors", metric=self._metric("Invocation5XXErrors", "Sum"),
            threshold=1, evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{self.endpoint_name}: the model container answered with 5xx errors")
        latency = cloudwatch.Alarm(
            self, "Latency", metric=self._metric("ModelLatency", "p90"),
            threshold=LATENCY_ALARM_SECONDS * 1_000_000,  # ModelLatency is in microseconds
            evaluation_periods=3, datapoints_to_alarm=2,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{self.endpoint_name}: p90 model latency above {LATENCY_ALARM_SECONDS} s, close to "
                              "SageMaker's 60 s invocation timeout")
        for alarm in (errors, latency):
            alarm.add_alarm_action(cloudwatch_actions.SnsAction(alarm_topic))
            alarm.add_ok_action(cloudwatch_actions.SnsAction(alarm_topic))

    def _autoscaling(self, config: FalconSettings, endpoint: sagemaker.CfnEndpoint) -> None:
        """Target tracking on invocations per instance; no role given, so the service-linked one is used."""
        target = CfnScalableTarget(
            self, "ScalableTarget",
            service_namespace="sagemaker",
            resource_id=f"endpoint/{self.endpoint_name}/variant/{VARIANT}",
            scalable_dimension="sagemaker:variant:DesiredInstanceCount",
            min_capacity=config.min_instances, max_capacity=config.max_instances)
        target.add_dependency(endpoint)
        slots = config.batch_size if config.batching == "dynamic" else config.max_rolling_batch_size
        CfnScalingPolicy(
            self, "InvocationsPerInstance",
            policy_name="invocations-per-instance",
            policy_type="TargetTrackingScaling",
            scaling_target_id=target.ref,
            target_tracking_scaling_policy_configuration=CfnScalingPolicy.TargetTrackingScalingPolicyConfigurationProperty(
                target_value=slots * INVOCATIONS_PER_SLOT_MINUTE,
                predefined_metric_specification=CfnScalingPolicy.PredefinedMetricSpecificationProperty(
                    predefined_metric_type="SageMakerVariantInvocationsPerInstance"),
                # A new GPU instance takes many minutes to load the model: scale out early, in slowly.
                scale_out_cooldown=300, scale_in_cooldown=900))
