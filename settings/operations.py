"""Operations (alarms, logs, watchdog) and the delivery pipeline."""

from __future__ import annotations

from typing import Literal

from settings.fields import ACCOUNT, LOG_RETENTION_DAYS, REGION, section, setting


@section
class OperationsSettings:
    """Glue and visibility: model registration, the training watchdog, alarms and the dashboard."""

    alarm_email: str | None = setting(None, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", allowed="an e-mail address",
                                      description="subscribed to the alarm topic (confirm by mail)")
    watchdog_minutes: int = setting(15, ge=5, le=1440, unit="minutes", description="training watchdog period")
    log_retention_days: Literal[LOG_RETENTION_DAYS] = setting(90, unit="days", description="Lambda log retention")
    powertools_version: str = setting("3.37.0", pattern=r"^\d+\.\d+\.\d+$", allowed="a version such as 3.37.0",
                                      description="Powertools for AWS Lambda layer, from the pinned package")
    endpoint_log_retention_days: Literal[LOG_RETENTION_DAYS] = setting(
        90, unit="days", description="retention of the endpoints' container log groups")


@section
class PipelineSettings:
    """The CDK pipeline that deploys dev, staging and prod; usually set once in cdk.json `shared`."""

    enabled: bool = setting(False, description="synthesize the delivery pipeline instead of one environment")
    connection_arn: str = setting(
        "arn:aws:codeconnections:us-west-2:111111111111:connection/00000000-0000-0000-0000-000000000000",
        pattern=r"^arn:aws[a-z-]*:code(star-)?connections:[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}$",
        allowed="a CodeConnections connection ARN", description="source connection")
    repository: str = setting("my-org/ml-recipes", pattern=r"^[\w.-]+/[\w.-]+$", allowed="owner/name",
                              description="source repository")
    branch: str = setting("main", pattern=r"^[\w./-]+$", allowed="a branch name", description="source branch")
    account: str | None = setting(None, pattern=ACCOUNT, allowed="a 12-digit AWS account id",
                                  description="the pipeline's account")
    region: str | None = setting(None, pattern=REGION, allowed="an AWS region name such as us-west-2",
                                 description="the pipeline's region")
    stages: tuple[str, ...] = setting(("dev", "staging", "prod"), allowed="environment names in deploy order",
                                      description="environments the pipeline deploys, in order")
    approval_before: str = setting("prod", pattern=r"^[a-z][a-z0-9-]*$", allowed="an environment name",
                                   description="a manual approval is placed before this stage")
