"""`make train`'s CLI against botocore Stubbers: every request and response is checked against the API model."""

from __future__ import annotations

import datetime

import boto3
import pytest
from botocore.stub import ANY, Stubber

from training import pipeline_cli

REGION = "us-west-2"
PIPELINE = "mlrecipes-dev-sentiment-training"
ARN = f"arn:aws:sagemaker:{REGION}:123456789012:pipeline/{PIPELINE}/execution/abc123def456"
JOB = "pipelines-abc123def456-Train-XyZ"
JOB_ARN = f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{JOB.lower()}"
PACKAGE_ARN = f"arn:aws:sagemaker:{REGION}:123456789012:model-package/mlrecipes-dev-sentiment/3"
MODEL_URL = f"s3://bucket/models/sentiment-sagemaker/jobs/{JOB}/output/model.tar.gz"
NOW = datetime.datetime(2026, 12, 3, 7, 0, tzinfo=datetime.UTC)


class Session:
    """Stands in for boto3's Session: hands out the stubbed clients."""

    def __init__(self):
        self.sagemaker = boto3.client("sagemaker", region_name=REGION, aws_access_key_id="x",
                                      aws_secret_access_key="x")
        self.logs = boto3.client("logs", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
        self.sm_stub, self.logs_stub = Stubber(self.sagemaker), Stubber(self.logs)

    def client(self, name):
        return {"sagemaker": self.sagemaker, "logs": self.logs}[name]


def _steps(*steps):
    return {"PipelineExecutionSteps": list(steps)}


def _train(status, reason=None):
    if status == "Starting":  # no job yet
        return {"StepName": "Train", "StepStatus": status}
    step = {"StepName": "Train", "StepStatus": status, "Metadata": {"TrainingJob": {"Arn": JOB_ARN}}}
    if reason:
        step["FailureReason"] = reason
    return step


def _job(status, secondary, metrics=()):
    return {
        "TrainingJobName": JOB, "TrainingJobArn": JOB_ARN, "ModelArtifacts": {"S3ModelArtifacts": MODEL_URL},
        "TrainingJobStatus": status, "SecondaryStatus": secondary, "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": NOW,
        "FinalMetricDataList": [{"MetricName": n, "Value": v, "Timestamp": NOW} for n, v in metrics],
    }  # fmt: skip


def _poll(session, status, steps, job=None, events=()):
    session.sm_stub.add_response("describe_pipeline_execution", {"PipelineExecutionStatus": status},
                                 {"PipelineExecutionArn": ARN})
    session.sm_stub.add_response("list_pipeline_execution_steps", steps,
                                 {"PipelineExecutionArn": ARN, "SortOrder": "Ascending"})
    if job is not None:
        session.sm_stub.add_response("describe_training_job", job, {"TrainingJobName": JOB.lower()})
        session.logs_stub.add_response(
            "filter_log_events",
            {"events": [{"eventId": str(i), "timestamp": 1000 + i, "message": m} for i, m in events]},
            {"logGroupName": "/aws/sagemaker/TrainingJobs", "logStreamNamePrefix": f"{JOB}/", "startTime": ANY})


def _start(session):
    session.sm_stub.add_response("start_pipeline_execution", {"PipelineExecutionArn": ARN}, {
        "PipelineName": PIPELINE, "PipelineExecutionDisplayName": ANY, "PipelineExecutionDescription": ANY,
        "ClientRequestToken": ANY})


def _run(session, *argv, sleep=lambda seconds: None):
    with session.sm_stub, session.logs_stub:
        status = pipeline_cli.main(["--env", "dev", *argv], session=session, sleep=sleep)
        session.sm_stub.assert_no_pending_responses()
        session.logs_stub.assert_no_pending_responses()
    return status


def test_success_shows_progress_and_ends_with_the_package_and_model_url(capsys):
    session = Session()
    _start(session)
    _poll(session, "Executing", _steps(_train("Starting")))
    _poll(session, "Executing", _steps(_train("Executing")), _job("InProgress", "Training"),
          [(1, "node 0 of 2 (algo-1): torchrun ..."), (2, "{'loss': '0.61', 'epoch': 1.0}")])
    _poll(session, "Succeeded",
          _steps(_train("Succeeded"),
                 {"StepName": "QualityGate", "StepStatus": "Succeeded", "Metadata": {"Condition": {"Outcome": "True"}}},
                 {"StepName": "Register", "StepStatus": "Succeeded",
                  "Metadata": {"RegisterModel": {"Arn": PACKAGE_ARN}}}),
          _job("Completed", "Completed", [("validation:recall_macro", 0.7123)]), [(2, "repeated line")])
    session.sm_stub.add_response("describe_model_package", {
        "ModelPackageName": "mlrecipes-dev-sentiment", "ModelPackageArn": PACKAGE_ARN, "CreationTime": NOW,
        "ModelPackageStatus": "Completed", "ModelPackageStatusDetails": {"ValidationStatuses": []},
        "ModelApprovalStatus": "PendingManualApproval",
        "InferenceSpecification": {"Containers": [{"Image": "image", "ModelDataUrl": MODEL_URL}]},
    }, {"ModelPackageName": PACKAGE_ARN})
    assert _run(session, "--interval", "0") == 0
    out = capsys.readouterr().out
    for expected in (f"started {PIPELINE}: {ARN}", "step Train: Starting", "step Train: Executing",
                     f"training job {JOB.lower()}", "job InProgress/Training", "| node 0 of 2 (algo-1)",
                     "metric validation:recall_macro = 0.7123", "step Register: Succeeded",
                     f"registered: {PACKAGE_ARN} (PendingManualApproval)", f"model.tar.gz: {MODEL_URL}"):
        assert expected in out, expected
    assert "repeated line" not in out  # a log event already shown is not printed twice
    assert out.count("step Train: Executing") == 1


def test_quality_gate_failure_names_the_step_and_exits_3(capsys):
    session = Session()
    _poll(session, "Failed",
          _steps(_train("Succeeded"),
                 {"StepName": "QualityGate", "StepStatus": "Succeeded",
                  "Metadata": {"Condition": {"Outcome": "False"}}},
                 {"StepName": "BelowQualityBar", "StepStatus": "Failed",
                  "FailureReason": "validation macro recall below the minimum 0.6: 0.41",
                  "Metadata": {"Fail": {"ErrorMessage": "validation macro recall below the minimum 0.6: 0.41"}}}),
          _job("Completed", "Completed", [("validation:recall_macro", 0.41)]))
    assert _run(session, "--attach", ARN) == pipeline_cli.EXIT_BELOW_BAR
    out = capsys.readouterr().out
    assert "not registered: step BelowQualityBar: validation macro recall below the minimum 0.6: 0.41" in out
    assert "started" not in out  # --attach follows, it starts nothing


def test_training_failure_names_the_step_and_reason(capsys):
    session = Session()
    _poll(session, "Failed", _steps(_train("Failed", "AlgorithmError: torchrun on algo-2 exited with status 1")),
          _job("Failed", "Failed"))
    assert _run(session, "--attach", ARN) == pipeline_cli.EXIT_FAILED
    assert "failed: step Train: AlgorithmError: torchrun on algo-2 exited with status 1" in capsys.readouterr().out


def test_ctrl_c_leaves_the_execution_running_and_says_how_to_stop_it(capsys):
    session = Session()
    _start(session)
    _poll(session, "Executing", _steps(_train("Starting")))

    def interrupted(seconds):
        raise KeyboardInterrupt

    assert _run(session, sleep=interrupted) == pipeline_cli.EXIT_INTERRUPTED
    out = capsys.readouterr().out
    assert f"the execution keeps running: {ARN}" in out
    assert f"aws sagemaker stop-pipeline-execution --region {REGION} --pipeline-execution-arn {ARN}" in out
    assert f"--attach {ARN}" in out


def test_pipeline_not_deployed_is_a_setup_error(capsys):
    session = Session()
    session.sm_stub.add_client_error("start_pipeline_execution", service_error_code="ResourceNotFound",
                                     service_message="Pipeline not found")
    assert _run(session) == pipeline_cli.EXIT_USAGE
    assert "deploy the environment with -c training.backend=sagemaker" in capsys.readouterr().err


def test_unknown_environment_is_a_setup_error(capsys):
    assert pipeline_cli.main(["--env", "qa"], session=Session()) == pipeline_cli.EXIT_USAGE
    assert "env='qa'" in capsys.readouterr().err


def test_pipeline_name_matches_the_stack():
    from settings import load_settings
    from stacks.sagemaker_pipeline import pipeline_name

    assert pipeline_cli.pipeline_name("prod") == (pipeline_name(load_settings("prod")), "us-west-2")


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_info:
        pipeline_cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for line in ("--attach", "130  Ctrl-C", "3    trained, but below training.min_macro_recall"):
        assert line in text


@pytest.mark.parametrize(("variables", "expected"), [
    (["HELP=1"], "-m training.pipeline_cli --help"),
    (["ENV=prod", "ARGS=--attach arn:x"], "-m training.pipeline_cli --env prod --attach arn:x"),
])
def test_make_train_passes_its_variables(variables, expected):
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(["make", "--no-print-directory", "-n", "train", *variables], cwd=root,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and expected in " ".join(done.stdout.splitlines()[-1].split())
