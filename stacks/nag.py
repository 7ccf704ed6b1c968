"""cdk-nag (AwsSolutions) wiring: one plugin for the app, one reason per acknowledged rule."""

from __future__ import annotations

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct


def add_checks(scope: cdk.Stage) -> None:
    """Run AwsSolutions over everything in the app; any unacknowledged finding fails synth."""
    cdk.Validations.of(scope).add_plugins(AwsSolutionsChecks(scope))


def acknowledge(construct: IConstruct, rule: str, reason: str) -> None:
    """Suppress one rule on one construct (and its children), with the reason a reviewer reads."""
    if not reason.strip():
        raise ValueError(f"acknowledging {rule} needs a reason")
    rule_id = rule if rule.startswith("AwsSolutions-") else f"AwsSolutions-{rule}"
    cdk.Validations.of(construct).acknowledge(cdk.Acknowledgment(id=rule_id, reason=reason))
