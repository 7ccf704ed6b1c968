"""The VPC the workloads run in: private subnets, NAT egress, flow logs and the endpoints they call."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from settings import Settings
from settings.network import EndpointSettings
from stacks.base import EnvironmentStack, log_retention
from stacks.nag import acknowledge, compliance

# Setting name -> the interface endpoint service it switches.
INTERFACE_ENDPOINTS: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "sagemaker_api": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_API,
    "sagemaker_runtime": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_RUNTIME,
    "ecr_api": ec2.InterfaceVpcEndpointAwsService.ECR,
    "ecr_docker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "cloudwatch_logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "ssm": ec2.InterfaceVpcEndpointAwsService.SSM,
    "ssm_messages": ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES,
    "ec2_messages": ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES,
    "sts": ec2.InterfaceVpcEndpointAwsService.STS,
}


class NetworkStack(EnvironmentStack):
    def __init__(self, scope: Construct, *, settings: Settings, key: kms.IKey) -> None:
        super().__init__(scope, "network", settings=settings, description="VPC, NAT egress and VPC endpoints")
        config = settings.network
        self.vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(config.cidr),
            max_azs=2,
            nat_gateways=config.nat_gateways,
            subnet_configuration=[
                # Public subnets hold only the NAT gateways, whose addresses are Elastic IPs: nothing launched
                # there needs an automatic public address (NIST/HIPAA/PCI VPCSubnetAutoAssignPublicIpDisabled).
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24,
                                        map_public_ip_on_launch=False),
                ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                        cidr_mask=20),
            ],
            restrict_default_security_group=True,
        )
        for subnet in self.vpc.public_subnets:
            acknowledge(subnet, compliance("VPCNoUnrestrictedRouteToIGW"),
                        "the NAT gateways' subnets route to the internet gateway; no workload runs in them")
        self.flow_log_group = logs.LogGroup(
            self, "FlowLogs",
            encryption_key=key,
            retention=log_retention(config.flow_log_retention_days),
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        self.vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group),
                              traffic_type=ec2.FlowLogTrafficType.ALL)
        self.endpoints = self._endpoints(config.endpoints, config.cidr)

        cdk.CfnOutput(self, "VpcId", value=self.vpc.vpc_id, description="VPC of this environment")
        cdk.CfnOutput(self, "PrivateSubnetIds",
                      value=",".join(s.subnet_id for s in self.vpc.private_subnets),
                      description="Private subnets the workloads run in")
        cdk.CfnOutput(self, "FlowLogGroupName", value=self.flow_log_group.log_group_name,
                      description="VPC flow logs")
        self._export_for_workloads()

    def _export_for_workloads(self) -> None:
        """Export what workload stacks import, whether or not a workload is part of this synth.

        CDK adds an export only while a consumer is in the same app, so a synth without the workloads (README
        step 1, a pipeline run with a workload switched off) would remove exports a deployed workload still
        imports, and CloudFormation refuses that ("Export ... cannot be deleted as it is in use by ..."):
        https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/intrinsic-function-reference-importvalue.html
        export_value() gives the same export names CDK generates for a consumer, so nothing is renamed.
        """
        self.export_value(self.vpc.vpc_id)
        for subnet in self.vpc.private_subnets:
            self.export_value(subnet.subnet_id)

    def _endpoints(self, switches: EndpointSettings, cidr: str) -> dict[str, ec2.IVpcEndpoint]:
        private = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        endpoints: dict[str, ec2.IVpcEndpoint] = {}
        if switches.s3_gateway:
            endpoints["s3_gateway"] = self.vpc.add_gateway_endpoint(
                "S3", service=ec2.GatewayVpcEndpointAwsService.S3, subnets=[private])
        for name, service in INTERFACE_ENDPOINTS.items():
            if getattr(switches, name):
                construct_id = "".join(part.capitalize() for part in name.split("_"))
                endpoint = self.vpc.add_interface_endpoint(
                    construct_id, service=service, subnets=private, private_dns_enabled=True, open=False)
                # The literal CIDR (not the VPC's token) lets cdk-nag verify the rule is not open to the world.
                endpoint.connections.allow_default_port_from(ec2.Peer.ipv4(cidr), "HTTPS from inside the VPC")
                endpoints[name] = endpoint
        return endpoints

