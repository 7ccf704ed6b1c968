"""Issue 45: the pipeline publishes our assets with a pinned tool that reads our manifests, and every CDK tool version
comes from package.json.

CDK Pipelines gives each asset a CodeBuild project that runs `npm install -g cdk-assets@<version>`, then
`cdk-assets --path "<manifest>" --verbose publish "<asset>:<destination>"` in the cloud assembly (aws-cdk-lib
pipelines/lib/codepipeline/codepipeline.js, `publishAssetsAction`). The test below runs the same release from
node_modules (`npm ci` installs it, with the lock's integrity hash) with the same `--path` and options, listing
instead of publishing: `ls` reads the manifest (and refuses a schema newer than it knows) and names every asset and
destination, without any AWS call.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest
from aws_cdk.assertions import Template

from stacks.toolchain import CDK_ASSETS, CDK_CLI, ToolchainError, cdk_assets_version, cdk_cli_version, pinned
from tests.conftest import REPO_ROOT, prerequisite

NODE_MODULES = REPO_ROOT / "node_modules"
CDK_ASSETS_BIN = NODE_MODULES / ".bin" / "cdk-assets"
needs_cdk_assets = prerequisite(
    shutil.which("node") is not None and CDK_ASSETS_BIN.exists(),
    "node and node_modules/.bin/cdk-assets (`make install` runs npm ci, which installs package.json's pins)")
# What CDK Pipelines' publishing projects run, word for word (shlex-split).
PUBLISH_SHAPE = ["cdk-assets", "--path", "<manifest>", "--verbose", "publish", "<asset>:<destination>"]
LISTED_ASSET = re.compile(r"^(?P<id>\S+) (?P<type>file|docker-image) (?P<source>\{.*\})$")
LISTED_DESTINATION = re.compile(r"^\s+└ (?P<selector>\S+) (?P<destination>\{.*\})$")


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


def _offline_environment(home) -> dict[str, str]:
    """Only what node needs, fake credentials, and every AWS endpoint on a closed local port: `ls` calls no AWS API,
    and if a release ever did, the call would fail here rather than reach AWS."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "NO_COLOR": "1", "AWS_ACCESS_KEY_ID": "offline",
            "AWS_SECRET_ACCESS_KEY": "offline", "AWS_REGION": "us-west-2", "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}


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


# --- the publisher reads what the pipeline gives it -------------------------------------------------------------------

@needs_cdk_assets
def test_the_pinned_cdk_assets_reads_every_manifest_and_resolves_every_destination_the_pipeline_publishes(
        synthesized, tmp_path):
    """Done when of issue 45: passes with the pinned release, fails with one that cannot read our schema (e.g.
    `Cloud assembly schema version mismatch: Maximum schema version supported is 54.x.x, but found 55.0.0`)."""
    result = synthesized("pipeline-sentiment")
    template = _pipeline(synthesized)
    wanted: dict[str, set[str]] = {}  # manifest path, relative to the cloud assembly -> "<asset>:<destination>"
    project_of: dict[str, dict] = {}
    for entry in _publishers(template).values():
        for command in entry["spec"]["phases"]["build"]["commands"]:
            words = shlex.split(command)
            shape = [word if i not in (2, 5) else PUBLISH_SHAPE[i] for i, word in enumerate(words)]
            assert shape == PUBLISH_SHAPE, command
            wanted.setdefault(words[2], set()).add(words[5])
            project_of[words[5]] = entry["project"]
    manifests = sorted({str(path.relative_to(result.outdir)) for path in result.outdir.rglob("*.assets.json")})
    assert set(wanted) <= set(manifests)
    # Every manifest of the assembly, each listed by the pinned binary as CodeBuild runs it: from the assembly's root.
    running = {manifest: subprocess.Popen([str(CDK_ASSETS_BIN), "--path", manifest, "--verbose", "ls"],
                                          cwd=result.outdir, env=_offline_environment(tmp_path), text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for manifest in manifests}
    listed: dict[str, tuple[str, dict]] = {}  # "<asset>:<destination>" -> (asset type, destination)
    for manifest, process in running.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, (f"cdk-assets {_installed(CDK_ASSETS)} (package.json pins "
                                         f"{cdk_assets_version()}) cannot read {manifest}:\n{err[-2000:]}")
        kind = None
        for line in out.splitlines():
            if asset := LISTED_ASSET.match(line):
                kind = asset["type"]
            elif destination := LISTED_DESTINATION.match(line):
                listed[destination["selector"]] = (kind, json.loads(destination["destination"]))
    kinds = set()
    for manifest, selectors in wanted.items():
        for selector in selectors:
            assert selector in listed, f"{selector} (published from {manifest}) is not in the manifest"
            kind, destination = listed[selector]
            kinds.add(kind)
            role = {"file": "file-publishing-role", "docker-image": "image-publishing-role"}[kind]
            assert role in destination["assumeRoleArn"], (selector, destination)
            environment = project_of[selector]["Properties"]["Environment"]
            if kind == "docker-image":  # the arm64 serving image, built natively, Docker needing privileged mode
                assert environment["Type"] == "ARM_CONTAINER" and environment["PrivilegedMode"] is True
    assert kinds == {"file", "docker-image"}


@needs_cdk_assets
def test_the_publish_command_the_pipeline_runs_is_one_the_pinned_release_offers(tmp_path):
    result = subprocess.run([str(CDK_ASSETS_BIN), "publish", "--help"], capture_output=True, text=True, timeout=60,
                            env=_offline_environment(tmp_path), check=True)
    assert "cdk-assets publish [ASSET..]" in result.stdout
    assert "--path" in result.stdout and "--verbose" in result.stdout
    version = subprocess.run([str(CDK_ASSETS_BIN), "--version"], capture_output=True, text=True, timeout=60,
                             env=_offline_environment(tmp_path), check=True)
    assert version.stdout.strip() == cdk_assets_version()


@needs_cdk_assets
def test_the_pinned_cdk_assets_builds_the_serving_image_as_the_manifest_asks_without_attestations():
    """What the pipeline's `docker build` gets: read in the pinned bundle (as tests/test_sentiment_stack.py reads the
    CLI's copy for workstation deploys)."""
    source = (NODE_MODULES / "cdk-assets" / "bin" / "cdk-assets.js").read_text()
    build = source[source.index("async build(options) {"):source.index("async login(ecr) {")]
    image = source[source.index("async buildImage(localTagName) {"):source.index("async isImageCached(")]
    assert "platform: source.platform" in image and "outputs: source.dockerOutputs" in image
    assert '...options.platform ? ["--platform", options.platform] : []' in build
    assert "...options.outputs ? options.outputs.map((output) => [`--output=${output}`]) : []" in build
    assert 'env: {\n            BUILDX_NO_DEFAULT_ATTESTATIONS: "1"' in build
    assert "--provenance" not in build and "--attest" not in build and "--sbom" not in build
    # The project's own variable reaches docker too: cdk-assets passes its environment on.
    assert "...process.env,\n              ...options.env," in source


# --- errors and what `make synth-pipeline` prints ---------------------------------------------------------------------

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


def test_the_synth_summary_names_each_tool_the_pipeline_installs(synthesized, capsys):
    from stacks.summary import main

    assert main([str(synthesized("pipeline-sentiment").outdir)]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pipeline installs: ")]
    publishers = len(_publishers(_pipeline(synthesized)))
    assert line == (f"pipeline installs: aws-cdk@{cdk_cli_version()} (1 project), "
                    f"cdk-assets@{cdk_assets_version()} ({publishers} projects)")
