"""Network and artifact bucket settings."""

from __future__ import annotations

from pydantic import model_validator

from settings.errors import SettingsError
from settings.fields import LogRetentionDays, section, setting, text


@section
class EndpointSettings:
    """VPC endpoints, each switchable: interface endpoints cost money per AZ and hour."""

    s3_gateway: bool = setting(True, description="S3 gateway endpoint (free)")
    sagemaker_api: bool = setting(True, description="interface endpoint for the SageMaker API")
    sagemaker_runtime: bool = setting(True, description="interface endpoint for SageMaker runtime (invocations)")
    ecr_api: bool = setting(True, description="interface endpoint for the ECR API")
    ecr_docker: bool = setting(True, description="interface endpoint for ECR image pulls")
    cloudwatch_logs: bool = setting(True, description="interface endpoint for CloudWatch Logs")
    ssm: bool = setting(True, description="interface endpoint for SSM (parameters, Session Manager)")
    ssm_messages: bool = setting(True, description="interface endpoint for Session Manager messages")
    ec2_messages: bool = setting(True, description="interface endpoint for SSM agent messages")
    sts: bool = setting(True, description="interface endpoint for STS")


@section
class NetworkSettings:
    cidr: text(r"^\d{1,3}(\.\d{1,3}){3}/(1[6-9]|2[0-4])$", "an IPv4 CIDR block from /16 to /24") = setting(
        "10.40.0.0/16", description="the VPC's address range")
    availability_zones: tuple[str, ...] = setting((), description="two zone names such as us-west-2a,us-west-2b, "
                                                  "needed only with an account (offline synth cannot look them up)")
    nat_gateways: int = setting(1, ge=1, le=2, description="NAT gateways (2 for zone redundancy)")
    flow_log_retention_days: LogRetentionDays = setting(90, unit="days", description="VPC flow log retention")
    endpoints: EndpointSettings = setting(default_factory=EndpointSettings, description="VPC endpoints")

    @model_validator(mode="after")
    def _two_zones(self) -> NetworkSettings:
        zones = self.availability_zones
        if zones and (len(zones) != 2 or len(set(zones)) != 2):
            raise SettingsError("network.availability_zones", ",".join(zones), "exactly two distinct zone names")
        return self


@section
class ArtifactSettings:
    noncurrent_version_expiration_days: int = setting(90, ge=1, le=3650, unit="days",
                                                      description="how long replaced artifact versions are kept")
    access_log_expiration_days: int = setting(365, ge=1, le=3650, unit="days",
                                              description="how long the bucket's access logs are kept")
