"""The log group SageMaker writes an endpoint's container logs to, owned by the stack whether or not it exists.

SageMaker fixes the name (/aws/sagemaker/Endpoints/<endpoint name>) and creates the group on the endpoint's first
log line. A plain AWS::Logs::LogGroup of that name fails with "already exists" in every environment whose endpoint
has logged, so the group is a custom resource (lambdas/endpoint_log_group) that creates it only if it is missing and
sets our key and retention on it either way. It is retained on delete: the logs outlive the stack.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from settings import REPO_ROOT
from stacks.base import log_retention
from stacks.nag import CUSTOM_RESOURCE_LAMBDA, acknowledge, acknowledge_each

# The operations stack's Lambda runtime (stacks/operations.py LAMBDA_RUNTIME; importing it here would be circular).
RUNTIME = lambda_.Runtime.PYTHON_3_14
RESOURCE_TYPE = "Custom::EndpointLogGroup"


class EndpointLogGroup(Construct):
    """`/aws/sagemaker/Endpoints/<endpoint_name>` with `key` and `retention_days`, adopted if it exists."""

    def __init__(self, scope: Construct, construct_id: str, *, endpoint_name: str, key: kms.IKey,
                 retention_days: int) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.log_group_name = f"/aws/sagemaker/Endpoints/{endpoint_name}"
        log_group_arn = f"arn:{stack.partition}:logs:{stack.region}:{stack.account}:log-group:{self.log_group_name}"

        function_logs = logs.LogGroup(self, "FunctionLogs", encryption_key=key,
                                      retention=log_retention(retention_days),
                                      removal_policy=cdk.RemovalPolicy.DESTROY)
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        description=f"Creates or adopts {self.log_group_name}")
        role.add_to_policy(iam.PolicyStatement(sid="WriteOwnLogs", actions=["logs:CreateLogStream",
                                                                            "logs:PutLogEvents"],
                                               resources=[function_logs.log_group_arn]))
        # Only this one log group; the `:*` form is the one IAM matches for log-group actions.
        role.add_to_policy(iam.PolicyStatement(
            sid="ManageEndpointLogGroup",
            actions=["logs:CreateLogGroup", "logs:AssociateKmsKey", "logs:PutRetentionPolicy"],
            resources=[log_group_arn, f"{log_group_arn}:*"]))
        function = lambda_.Function(
            self, "Function",
            description=f"Creates {self.log_group_name} if missing; sets key and retention (CloudFormation)",
            runtime=RUNTIME,
            handler="handler.handler",
            code=lambda_.Code.from_asset(str(REPO_ROOT / "lambdas" / "endpoint_log_group"),
                                         exclude=["__pycache__"]),
            role=role,
            log_group=function_logs,
            timeout=cdk.Duration.seconds(60),
            memory_size=128,
            tracing=lambda_.Tracing.ACTIVE,  # like every Lambda of ours (Serverless-LambdaTracing)
        )
        # CDK writes both a DependsOn and a GetAtt on the role; cfn-lint notes the redundancy (W3005).
        function.node.default_child.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
        self.resource = cdk.CustomResource(
            self, "Resource", service_token=function.function_arn, resource_type=RESOURCE_TYPE,
            properties={"LogGroupName": self.log_group_name, "RetentionInDays": str(retention_days),
                        "KmsKeyArn": key.key_arn},
            removal_policy=cdk.RemovalPolicy.RETAIN)
        # cdk-nag names the finding with the template's pseudo parameters where the stack's env is not concrete.
        partition, region, account = (f"<AWS::{pseudo}>" if cdk.Token.is_unresolved(value) else value
                                      for pseudo, value in (("Partition", stack.partition), ("Region", stack.region),
                                                            ("AccountId", stack.account)))
        finding = f"arn:{partition}:logs:{region}:{account}:log-group:{self.log_group_name}:*"
        acknowledge(role, f"IAM5[Resource::{finding}]",
                    "log-group actions match the group's ARN with the :* suffix; scoped to this one group")
        acknowledge(role, "IAM5[Resource::*]",
                    "xray:PutTraceSegments and xray:PutTelemetryRecords (active tracing) have no resource-level scope.")
        acknowledge_each(function, CUSTOM_RESOURCE_LAMBDA)


def endpoint_log_group(scope: Construct, endpoint_name: str, *, key: kms.IKey, retention_days: int) -> EndpointLogGroup:
    """The endpoint's log group (see the module docstring); the endpoint should depend on it.

    "EndpointLogs" + the custom resource's "Resource" keep the logical id the AWS::Logs::LogGroup had in 526689a..
    e48dc78, on purpose: a stack deployed from those commits is then refused at change-set creation ("Update of
    resource type is not permitted") instead of losing its group in the clean-up phase (tests/test_upgrade.py).
    """
    return EndpointLogGroup(scope, "EndpointLogs", endpoint_name=endpoint_name, key=key,
                            retention_days=retention_days)
