"""Operations (alarms, logs, watchdog) and the delivery pipeline."""

from __future__ import annotations

from settings.fields import AwsAccount, AwsRegion, LogRetentionDays, section, setting, text

Email = text(r"^[^@\s]+@[^@\s]+\.[^@\s]+$", "an e-mail address")
Version = text(r"^\d+\.\d+\.\d+$", "a version such as 3.37.0")
ConnectionArn = text(r"^arn:aws[a-z-]*:code(star-)?connections:[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}$",
                     "a CodeConnections connection ARN")
EXAMPLE_CONNECTION = "arn:aws:codeconnections:us-west-2:111111111111:connection/00000000-0000-0000-0000-000000000000"


@section
class OperationsSettings:
    """Glue and visibility: model registration, the training watchdog, alarms and the dashboard."""

    alarm_email: Email | None = setting(None, "subscribed to the alarm topic (confirm by mail)")
    watchdog_minutes: int = setting(15, "training watchdog period", ge=5, le=1440, unit="minutes")
    log_retention_days: LogRetentionDays = setting(90, "Lambda log retention", unit="days")
    powertools_version: Version = setting("3.37.0", "Powertools for AWS Lambda layer, built from the pinned package")
    endpoint_log_retention_days: LogRetentionDays = setting(90, "endpoint log retention", unit="days")


@section
class PipelineSettings:
    """The CDK pipeline that deploys dev, staging and prod; usually set once in cdk.json `shared`."""

    enabled: bool = setting(False, "synthesize the delivery pipeline instead of one environment")
    connection_arn: ConnectionArn = setting(EXAMPLE_CONNECTION, "source connection")
    repository: text(r"^[\w.-]+/[\w.-]+$", "owner/name") = setting("my-org/ml-recipes", "source repo")
    branch: text(r"^[\w./-]+$", "a branch name") = setting("main", "source branch")
    account: AwsAccount | None = setting(None, "the pipeline's account")
    region: AwsRegion | None = setting(None, "the pipeline's region")
    stages: tuple[str, ...] = setting(("dev", "staging", "prod"), "environments to deploy, in order")
    approval_before: text(r"^[a-z][a-z0-9-]*$", "an environment name") = setting("prod", "approval before this stage")
