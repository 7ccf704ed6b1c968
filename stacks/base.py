"""What every stack of an environment shares: its AWS environment, its name and its tags."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_logs as logs
from constructs import Construct

from settings import Settings
from settings.fields import LOG_RETENTION_DAYS


class EnvironmentStack(cdk.Stack):
    """A stack named and tagged for one environment, with availability zones that need no lookup."""

    def __init__(self, scope: Construct, name: str, *, settings: Settings, description: str) -> None:
        stack_name = f"{settings.stack_prefix}-{name}"
        super().__init__(
            scope,
            stack_name,
            # Explicit, so the pipeline's stages deploy the same stacks a workstation deploy does.
            stack_name=stack_name,
            env=cdk.Environment(account=settings.account, region=settings.region),
            description=f"{description} ({settings.project}, {settings.name})",
            termination_protection=settings.name == "prod",
        )
        self._zones = settings.network.availability_zones
        for key, value in settings.tags.items():
            cdk.Tags.of(self).add(key, value)

    @property
    def availability_zones(self) -> list[str]:
        # With a concrete account the CDK would ask AWS for zone names at synth; offline synth must not.
        if self._zones:
            return list(self._zones)
        if not cdk.Token.is_unresolved(self.account) and not cdk.Token.is_unresolved(self.region):
            return [f"{self.region}a", f"{self.region}b"]
        return super().availability_zones


def log_retention(days: int) -> logs.RetentionDays:
    """The RetentionDays member for a number of days (the settings allow only CloudWatch's periods)."""
    finite = [member for member in logs.RetentionDays if member.name != "INFINITE"]
    by_days = dict(zip(LOG_RETENTION_DAYS, finite, strict=True))
    return by_days[days]


def endpoint_log_group(scope: Construct, endpoint_name: str, *, key, retention_days: int):
    """The endpoint's log group, created or adopted by a retained custom resource (stacks/endpoint_logs.py).

    Kept here so the stacks' call sites stay as they are; imported late because stacks.endpoint_logs uses this
    module's log_retention.
    """
    from stacks.endpoint_logs import endpoint_log_group as adopting_log_group

    return adopting_log_group(scope, endpoint_name, key=key, retention_days=retention_days)
