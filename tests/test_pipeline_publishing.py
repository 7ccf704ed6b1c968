"""Issue 45: every CDK tool version the pipeline and workstations run comes from one place, package.json, exactly
pinned, and the pipeline's asset publishing projects install a pinned cdk-assets instead of CDK Pipelines' `latest`.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from aws_cdk.assertions import Template

from stacks.toolchain import CDK_ASSETS, CDK_CLI, ToolchainError, cdk_assets_version, cdk_cli_version, pinned
from tests.conftest import REPO_ROOT, prerequisite

NODE_MODULES = REPO_ROOT / "node_modules"
CDK_ASSETS_BIN = NODE_MODULES / ".bin" / "cdk-assets"
needs_cdk_assets = prerequisite(
    shutil.which("node") is not None and CDK_ASSETS_BIN.exists(),
    "node and node_modules/.bin/cdk-assets (`make install` runs npm ci, which installs package.json's pins)")


def _pipeline(synthesized) -> Template:
    return Template.from_json(synthesized("pipeline-sentiment").templates["mlrecipes-pipeline"])


def _buildspecs(template: Template) -> dict[str, dict]:
    """Every CodeBuild project of the pipeline stack with its inline buildspec, by logical id."""
    projects = template.find_resources("AWS::CodeBuild::Project")
    return {name: {"project": project, "spec": json.loads(project["Properties"]["Source"]["BuildSpec"])}
            for name, project in projects.items()}


def _publishers(template: Template) -> dict[str, dict]:
    """The asset publishing projects: those whose build phase runs cdk-assets."""
    return {name: entry for name, entry in _buildspecs(template).items()
            if any(command.startswith("cdk-assets ") for command in entry["spec"]["phases"]["build"]["commands"])}


def _installed(package: str) -> str:
    return json.loads((NODE_MODULES / package / "package.json").read_text())["version"]


# --- one source of truth: package.json -------------------------------------------------------------------------------

@needs_cdk_assets
def test_package_json_pins_each_tool_exactly_and_the_lock_and_node_modules_hold_those_releases():
    lock = json.loads((REPO_ROOT / "package-lock.json").read_text())["packages"]
    for package in (CDK_CLI, CDK_ASSETS):
        version = pinned(package)
        assert lock[""]["devDependencies"][package] == version, package
        assert lock[f"node_modules/{package}"]["version"] == version, package
        installed = _installed(package)
        assert installed == version, f"node_modules has {package} {installed}, package.json pins {version}: npm ci"


def test_workstation_pipeline_synth_and_self_mutation_run_the_one_pinned_cli(synthesized):
    makefile = (REPO_ROOT / "Makefile").read_text()
    # Workstations and the pipeline's synth step: `npm ci` installs the lock's CLI, `npx cdk` runs it.
    assert "\tnpm ci " in makefile and "\tnpx cdk synth " in makefile
    specs = _buildspecs(_pipeline(synthesized))
    [synth] = [e["spec"] for e in specs.values() if "make test-infra" in e["spec"]["phases"]["build"]["commands"]]
    assert synth["phases"]["install"]["commands"] == ["make install-infra"]
    assert synth["phases"]["build"]["commands"][-1].startswith("npx cdk synth ")
    # Self-mutation installs the CLI itself (CodePipeline's cli_version, whose default is "2": any 2.x).
    [mutation] = [e["spec"] for e in specs.values()
                  if any(c.startswith("cdk -a ") and " deploy " in c for c in e["spec"]["phases"]["build"]["commands"])]
    assert mutation["phases"]["install"]["commands"] == [f"npm install -g aws-cdk@{cdk_cli_version()}"]


def test_every_asset_publishing_project_installs_the_pinned_cdk_assets_and_nothing_installs_latest(synthesized):
    template = _pipeline(synthesized)
    publishers = _publishers(template)
    assert len(publishers) >= 2  # file assets and the serving image
    for entry in publishers.values():
        assert entry["spec"]["phases"]["install"]["commands"] == [f"npm install -g cdk-assets@{cdk_assets_version()}"]
    for name, entry in _buildspecs(template).items():
        installs = [c for phase in entry["spec"]["phases"].values() for c in phase.get("commands", [])
                    if c.startswith("npm install -g ")]
        for command in installs:
            assert re.fullmatch(r"npm install -g (aws-cdk|cdk-assets)@\d+\.\d+\.\d+", command), (name, command)


# --- errors ---------------------------------------------------------------------

@pytest.mark.parametrize(("dependencies", "message"), [
    ({"aws-cdk": "2.1148.1"}, "package.json: devDependencies.cdk-assets is missing: expected an exact version"),
    ({"cdk-assets": "latest"}, 'package.json: devDependencies.cdk-assets="latest": expected an exact version such '
                               "as 1.2.3, not a range or a tag"),
    ({"cdk-assets": "^4.7.3"}, 'devDependencies.cdk-assets="^4.7.3": expected an exact version'),
])
def test_a_tool_not_pinned_exactly_is_refused_naming_key_value_and_what_is_allowed(tmp_path, dependencies, message):
    package_json = tmp_path / "package.json"
    package_json.write_text(json.dumps({"devDependencies": dependencies}))
    with pytest.raises(ToolchainError, match=re.escape(message)):
        pinned(CDK_ASSETS, package_json)
