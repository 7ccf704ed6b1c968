"""Operations (alarms, logs, watchdog) and the delivery pipeline."""

from __future__ import annotations

from settings.fields import AwsAccount, AwsRegion, LogRetentionDays, section, setting, text


@section
class OperationsSettings:
    """Glue and visibility: model registration, the training watchdog, alarms and the dashboard."""

    alarm_email: text(r"^[^@\s]+@[^@\s]+\.[^@\s]+$", "an e-mail address") | None = setting(
        None, description="subscribed to the alarm topic (confirm by mail)")
    watchdog_minutes: int = setting(15, ge=5, le=1440, unit="minutes", description="training watchdog period")
    log_retention_days: LogRetentionDays = setting(90, unit="days", description="Lambda log retention")
    powertools_version: text(r"^\d+\.\d+\.\d+$", "a version such as 3.37.0") = setting(
        "3.37.0", description="Powertools for AWS Lambda layer, built from the pinned package")
    endpoint_log_retention_days: LogRetentionDays = setting(90, unit="days", description="endpoint log retention")


@section
class PipelineSettings:
    """The CDK pipeline that deploys dev, staging and prod; usually set once in cdk.json `shared`."""

    enabled: bool = setting(False, description="synthesize the delivery pipeline instead of one environment")
    connection_arn: text(r"^arn:aws[a-z-]*:code(star-)?connections:[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}$",
                         "a CodeConnections connection ARN") = setting(
        "arn:aws:codeconnections:us-west-2:111111111111:connection/00000000-0000-0000-0000-000000000000",
        description="source connection")
    repository: text(r"^[\w.-]+/[\w.-]+$", "owner/name") = setting("my-org/ml-recipes", description="source repo")
    branch: text(r"^[\w./-]+$", "a branch name") = setting("main", description="source branch")
    account: AwsAccount | None = setting(None, description="the pipeline's account")
    region: AwsRegion | None = setting(None, description="the pipeline's region")
    stages: tuple[str, ...] = setting(("dev", "staging", "prod"), description="environments to deploy, in order")
    approval_before: text(r"^[a-z][a-z0-9-]*$", "an environment name") = setting(
        "prod", description="a manual approval is placed before this stage")
