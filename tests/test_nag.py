"""Our cdk-nag wiring (stacks/nag.py): five packs run, a finding without a reason fails synth, a reason clears it."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_sqs as sqs

from stacks import nag


def test_every_pack_runs_over_the_app():
    assert [pack.__name__ for pack in nag.PACKS] == ["AwsSolutionsChecks", "NIST80053R5Checks",
                                                      "HIPAASecurityChecks", "PCIDSS321Checks", "ServerlessChecks"]
    assert nag.compliance("LambdaInsideVPC") == ("NIST.800.53.R5-LambdaInsideVPC", "HIPAA.Security-LambdaInsideVPC",
                                                 "PCI.DSS.321-LambdaInsideVPC")


def _synth(tmp_path, acknowledged: bool):
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "nag-probe")
    queue = sqs.Queue(stack, "Plain", enforce_ssl=True, encryption=sqs.QueueEncryption.SQS_MANAGED)
    if acknowledged:
        nag.acknowledge(queue, ("SQS3", "Serverless-SQSRedrivePolicy"), "a probe queue, for this test only")
    nag.add_checks(app)
    app.synth()
    return tmp_path / "validation-report.json"


def test_a_serverless_finding_fails_synth_until_acknowledged_with_a_reason(tmp_path):
    with pytest.raises(RuntimeError):
        _synth(tmp_path / "bare", acknowledged=False)
    report = (tmp_path / "bare" / "validation-report.json").read_text()
    assert "Serverless-SQSRedrivePolicy" in report
    _synth(tmp_path / "kept", acknowledged=True)
    with pytest.raises(ValueError, match="needs a reason"):
        nag.acknowledge(cdk.App(), "SQS3", " ")
