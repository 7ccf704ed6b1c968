"""Network and artifact bucket settings."""

from __future__ import annotations

from pydantic import model_validator

from settings.fields import LogRetentionDays, SettingsError, section, setting, text


@section
class EndpointSettings:
    """VPC endpoints, each switchable: interface endpoints cost money per AZ and hour."""

    s3_gateway: bool = setting(True, "S3 gateway endpoint (free)")
    sagemaker_api: bool = setting(True, "interface endpoint for the SageMaker API")
    sagemaker_runtime: bool = setting(True, "interface endpoint for SageMaker runtime (invocations)")
    ecr_api: bool = setting(True, "interface endpoint for the ECR API")
    ecr_docker: bool = setting(True, "interface endpoint for ECR image pulls")
    cloudwatch_logs: bool = setting(True, "interface endpoint for CloudWatch Logs")
    ssm: bool = setting(True, "interface endpoint for SSM (parameters, Session Manager)")
    ssm_messages: bool = setting(True, "interface endpoint for Session Manager messages")
    ec2_messages: bool = setting(True, "interface endpoint for SSM agent messages")
    sts: bool = setting(True, "interface endpoint for STS")


Cidr = text(r"^\d{1,3}(\.\d{1,3}){3}/(1[6-9]|2[0-4])$", "an IPv4 CIDR block from /16 to /24")


@section
class NetworkSettings:
    cidr: Cidr = setting("10.40.0.0/16", "the VPC's address range")
    availability_zones: tuple[str, ...] = setting((), "two zone names such as us-west-2a,us-west-2b; needed only "
                                                  "with an account (offline synth cannot look them up)")
    nat_gateways: int = setting(1, "NAT gateways (2 for zone redundancy)", ge=1, le=2)
    flow_log_retention_days: LogRetentionDays = setting(90, "VPC flow log retention", unit="days")
    endpoints: EndpointSettings = setting(EndpointSettings, "VPC endpoints")

    @model_validator(mode="after")
    def _two_zones(self) -> NetworkSettings:
        zones = self.availability_zones
        if zones and (len(zones) != 2 or len(set(zones)) != 2):
            raise SettingsError("network.availability_zones", ",".join(zones), "exactly two distinct zone names")
        return self


@section
class ArtifactSettings:
    noncurrent_version_expiration_days: int = setting(90, "replaced versions kept", ge=1, le=3650, unit="days")
    access_log_expiration_days: int = setting(365, "access logs kept", ge=1, le=3650, unit="days")
