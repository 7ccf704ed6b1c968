"""cdk-nag wiring: five rule packs over the whole app, and one helper that acknowledges a finding with its reason.

Packs (cdk-nag 3.0.2): AwsSolutions, NIST 800-53 rev 5, HIPAA Security, PCI DSS 3.2.1 and Serverless. The three
compliance packs share most rule names (`NIST.800.53.R5-LambdaInsideVPC`, `HIPAA.Security-LambdaInsideVPC`, ...),
so `compliance("LambdaInsideVPC")` names a rule in all three. Any unacknowledged finding fails synth.
"""

from __future__ import annotations

from collections.abc import Iterable

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks, PCIDSS321Checks, ServerlessChecks
from constructs import IConstruct

PACKS = (AwsSolutionsChecks, NIST80053R5Checks, HIPAASecurityChecks, PCIDSS321Checks, ServerlessChecks)
COMPLIANCE_PACKS = ("NIST.800.53.R5", "HIPAA.Security", "PCI.DSS.321")
_PREFIXES = ("AwsSolutions-", "Serverless-", *(f"{pack}-" for pack in COMPLIANCE_PACKS))


def compliance(rule: str) -> tuple[str, ...]:
    """The rule's id in each compliance pack (NIST 800-53 R5, HIPAA, PCI DSS 3.2.1)."""
    return tuple(f"{pack}-{rule}" for pack in COMPLIANCE_PACKS)


# Findings that share one reason wherever they occur, said once for the whole app.
APP_WIDE = {
    compliance("IAMNoInlinePolicy"):
        "CDK grants write each role's own inline DefaultPolicy, scoped to that role's resources",
}
# Our glue Lambdas (the endpoint log-group custom resource, the operations functions, CDK's AwsCustomResource
# provider): what the packs ask of every function, and why each of these keeps it.
GLUE_LAMBDA = {
    compliance("LambdaInsideVPC"):
        "calls only AWS APIs and reaches nothing inside the VPC; a VPC would add interfaces and endpoints for nothing",
    compliance("LambdaConcurrency"):
        "runs a few times an hour at most; a reservation would take from the account's unreserved concurrency, "
        "which Lambda keeps above a minimum (low-quota accounts have nothing to reserve)",
}
# Custom-resource Lambdas: CloudFormation is their only caller and reports a failure itself as a stack event.
CUSTOM_RESOURCE_LAMBDA = {
    **GLUE_LAMBDA,
    (*compliance("LambdaDLQ"), "Serverless-LambdaDLQ"):
        "CloudFormation is the only caller and shows a failure as a stack event; a queued event has no one to act",
}


def add_checks(scope: cdk.Stage) -> None:
    """Run every pack over everything in the app; any unacknowledged finding fails synth."""
    cdk.Validations.of(scope).add_plugins(*(pack(scope) for pack in PACKS))
    acknowledge_each(scope, APP_WIDE)


def acknowledge_each(construct: IConstruct, findings: dict[tuple[str, ...], str]) -> None:
    """`acknowledge` for each (rules, reason) of a shared table such as GLUE_LAMBDA."""
    for rules, reason in findings.items():
        acknowledge(construct, rules, reason)


def acknowledge(construct: IConstruct, rules: str | Iterable[str], reason: str) -> None:
    """Suppress rules on one construct (and its children), with the reason a reviewer reads.

    A rule without a pack prefix is AwsSolutions' ("IAM5[Resource::*]"); others name their pack
    ("Serverless-LambdaDLQ") or come from `compliance()`.
    """
    if not reason.strip():
        raise ValueError(f"acknowledging {rules} needs a reason")
    for rule in [rules] if isinstance(rules, str) else rules:
        rule_id = rule if rule.startswith(_PREFIXES) else f"AwsSolutions-{rule}"
        cdk.Validations.of(construct).acknowledge(cdk.Acknowledgment(id=rule_id, reason=reason))
