"""The app as users run it: through `npx cdk` and `python app.py`, offline, with no AWS credentials."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, prerequisite

CDK = REPO_ROOT / "node_modules" / ".bin" / "cdk"


def offline_env(**extra: str) -> dict[str, str]:
    """No credentials, no profile, no telemetry: what a fresh CI machine has."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
    env.update(JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20", CDK_DISABLE_CLI_TELEMETRY="true",
               CDK_DISABLE_VERSION_CHECK="true", AWS_CONFIG_FILE="/dev/null",
               AWS_SHARED_CREDENTIALS_FILE="/dev/null", AWS_EC2_METADATA_DISABLED="true", **extra)
    return env


def run_app(context: dict[str, str], outdir: Path) -> subprocess.CompletedProcess:
    env = offline_env(CDK_CONTEXT_JSON=json.dumps(context), CDK_OUTDIR=str(outdir))
    return subprocess.run([sys.executable, "app.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


BAD_SETTINGS = [
    ({"falcon.tensor_parallel_degree": "three"},
     "error: invalid setting falcon.tensor_parallel_degree='three': expected one of 1, 2, 4, 8"),
    # issue 20: an unknown key (with the nearest name), a wrong type, an out-of-range value, a wrong choice
    ({"prod/falcon.max_rolling_batch_sise": "64", "env": "prod"},
     "error: invalid setting falcon.max_rolling_batch_sise='64': expected a known setting "
     "(did you mean falcon.max_rolling_batch_size?); falcon has: batch_size, batching, "),
    ({"sentiment.min_instances": "two"},
     "error: invalid setting sentiment.min_instances='two': expected an integer from 1 to 20"),
    ({"network.nat_gateways": "3"}, "error: invalid setting network.nat_gateways='3': expected a value from 1 to 2"),
    ({"training.backend": "batch"}, "error: invalid setting training.backend='batch': expected one of ec2, sagemaker"),
    # issue 43: a retired setting names what replaces it
    ({"sentiment.runtime": "dlc"}, "error: invalid setting sentiment.runtime='dlc': expected it removed (retired in "
                                   "issue 43): our serving image is the only sentiment runtime"),
]


def test_bad_setting_exits_1_with_one_line(tmp_path):
    """The app as a process, once: exit status 1, one line on stderr, no assembly."""
    result = run_app({"env": "nope"}, tmp_path)
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: invalid setting env='nope': expected one of dev, staging, prod, smoke"), line
    assert not (tmp_path / "manifest.json").exists()


def app_main(context: dict[str, str], outdir: Path, monkeypatch) -> int:
    """`app.main` in this process on `context`: what `python app.py` does, without a second jsii start."""
    import app
    from stacks import environment

    monkeypatch.setattr(app, "new_app", lambda: environment.new_app(context=context, outdir=str(outdir)))
    return app.main()


@pytest.mark.parametrize(("context", "expected"), BAD_SETTINGS)
def test_bad_settings_stop_the_app_with_the_line_it_prints(tmp_path, monkeypatch, capsys, context, expected):
    """More bad settings through `app.main`, in this process: the line it prints and its status."""
    assert app_main(context, tmp_path, monkeypatch) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(expected), line
    assert not (tmp_path / "manifest.json").exists()


needs_cli = prerequisite(CDK.exists() and shutil.which("node") is not None,
                         "the CDK CLI and node (`make test` installs the CLI with npm ci)")


def _cdk(args: list[str], outdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CDK), "synth", "--quiet", "--no-notices", "-o", str(outdir), *args], cwd=REPO_ROOT,
                          env=offline_env(), capture_output=True, text=True, timeout=600)


@needs_cli
def test_cdk_synth_with_a_bad_override_fails_with_one_clear_line(tmp_path):
    result = _cdk(["-c", "falcon.tensor_parallel_degree=three"], tmp_path)
    assert result.returncode != 0
    ours = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert ours == ["error: invalid setting falcon.tensor_parallel_degree='three': expected one of 1, 2, 4, 8"]
    assert "Traceback" not in result.stderr


def test_summary_lists_stacks_and_resource_counts(synthesized, capsys):
    from stacks.summary import main

    assert main([str(synthesized("dev").outdir)]) == 0
    out = capsys.readouterr().out
    assert "mlrecipes-dev-network" in out and "mlrecipes-dev-artifacts" in out
    assert "3 stacks," in out


def test_summary_without_an_assembly_says_what_to_do(tmp_path, capsys):
    from stacks.summary import main

    assert main([str(tmp_path)]) == 1
    assert "make synth" in capsys.readouterr().err


def test_cfn_lint_finds_no_errors(synthesized):
    configurations = ("dev", "prod", "prod-account", "prod-training", "prod-sentiment")
    templates = [synthesized(name).outdir for name in configurations]
    files = sorted(str(p) for d in templates for p in d.glob("*.template.json"))
    assert files
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run([str(cfn_lint), *files], capture_output=True, text=True, timeout=600)
    # cfn-lint's exit status is a bit mask: 2 = errors, 4 = warnings, 8 = informational; 1 = it failed to run.
    assert result.returncode in (0, 4, 8, 12), result.stdout[-5000:] + result.stderr[-2000:]


@needs_cli
def test_cdk_synth_of_the_pipeline_and_its_prod_stage_works_offline_without_credentials(tmp_path):
    """The CLI's whole path with no AWS (offline_env): the pipeline, and in it prod's stacks, synthesized by one
    `cdk synth` (prod's own stacks through `app_main` and `synthesized` are tested in this process)."""
    context_file = REPO_ROOT / "cdk.context.json"
    before = context_file.read_text() if context_file.exists() else None
    result = _cdk(["-c", "pipeline.enabled=true", "mlrecipes-pipeline"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "mlrecipes-pipeline.template.json").exists()
    manifest = json.loads((tmp_path / "assembly-mlrecipes-pipeline-prod" / "manifest.json").read_text())
    stacks = sorted(a["displayName"] for a in manifest["artifacts"].values()
                    if a["type"] == "aws:cloudformation:stack")
    assert stacks == [f"mlrecipes-pipeline/prod/mlrecipes-prod-{name}" for name in ("artifacts", "network",
                                                                                     "operations")]
    after = context_file.read_text() if context_file.exists() else None
    assert after == before and (after is None or json.loads(after) == {}), "synth cached a lookup"
