"""Shared fixtures: each configuration is synthesized once per test session (jsii start-up is slow)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Idle OpenMP threads sleep instead of spinning, here and in every process a test starts (servers set the same
# default for themselves): with several xdist workers on 2 cores, spinning threads burn the CPU the others need.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO_ROOT = Path(__file__).resolve().parent.parent

# The configurations the stack tests look at, by name: (environment, overrides).
CONFIGURATIONS: dict[str, tuple[str, dict[str, str]]] = {
    "pipeline": ("dev", {"pipeline.enabled": "true", "prod/artifacts.noncurrent_version_expiration_days": "400"}),
    # The pipeline with the sentiment endpoint in every stage: its arm64 image is an asset the pipeline publishes.
    "pipeline-sentiment": ("dev", {"pipeline.enabled": "true", "sentiment.enabled": "true",
                                   "sentiment.model_data_url": "s3://example-bucket/run-0001/model.tar.gz"}),
    "dev": ("dev", {}),
    "prod": ("prod", {}),
    "prod-account": ("prod", {"account": "123456789012", "region": "eu-central-2",
                              "network.endpoints.sts": "false"}),
    "prod-training": ("prod", {"training.enabled": "true"}),
    "smoke": ("smoke", {}),
    # What `make e2e` deploys last: every part of the smoke environment at once.
    "smoke-all": ("smoke", {"training.enabled": "true", "training.run_id": "smoke-20261202-120000",
                            "sentiment.enabled": "true",
                            "sentiment.model_data_url": "s3://example/models/sentiment/smoke/model.tar.gz"}),
    "prod-sentiment": ("prod", {"sentiment.enabled": "true",
                                "sentiment.model_data_url": "s3://example-bucket/models/sentiment/run-0001/model.tar.gz",
                                "operations.alarm_email": "ops@example.com"}),
    # prod with every workload on: the upgrade test's configuration (tests/upgrade_baseline/refresh.py CONTEXT).
    "prod-all-on": ("prod", {"training.enabled": "true", "sentiment.enabled": "true",
                             "sentiment.model_data_url": "s3://example-bucket/models/sentiment/run-0001/model.tar.gz",
                             "falcon.enabled": "true", "falcon.model_s3_uri": "s3://models-bucket/falcon-40b/"}),
    "prod-training-run2": ("prod", {"training.enabled": "true", "training.run_id": "run-0002"}),
    # The done-when of issue 16: two spot instances from a SageMaker Pipeline.
    "dev-sagemaker": ("dev", {"training.backend": "sagemaker", "training.instance_count": "2",
                              "training.spot": "true"}),
    "prod-training-reserved": ("prod", {"training.enabled": "true", "account": "123456789012", "region": "us-west-2",
                                        "network.availability_zones": "us-west-2a,us-west-2b",
                                        "training.availability_zone": "us-west-2b",
                                        "training.capacity_reservation_id": "cr-0123456789abcdef0"}),
}


@dataclass
class Synthesized:
    """One synthesized app: its cloud assembly folder and each stack's template by stack name."""

    outdir: Path
    templates: dict[str, dict]

    def template(self, suffix: str):
        from aws_cdk.assertions import Template

        matches = [name for name in self.templates if name.endswith(f"-{suffix}")]
        assert len(matches) == 1, f"expected one stack ending in -{suffix}, found {sorted(self.templates)}"
        return Template.from_json(self.templates[matches[0]])


def synthesize(outdir: Path, env_name: str, overrides: dict[str, str]) -> Synthesized:
    """Synthesize like `cdk synth -c env=... -c key=value` does, with cdk-nag; fail with its findings."""
    from stacks.environment import build_app, new_app
    from stacks.nag import add_checks

    app = new_app(context={"env": env_name, **overrides}, outdir=str(outdir))
    build_app(app)
    add_checks(app)
    try:
        app.synth()
    except RuntimeError as error:
        report = outdir / "validation-report.json"
        details = report.read_text() if report.exists() else ""
        pytest.fail(f"synth of {env_name} {overrides} failed: {error}\n{details[:20000]}")
    return Synthesized(outdir=outdir, templates=read_templates(outdir))


def read_templates(assembly: Path) -> dict[str, dict]:
    """Every stack template of a cloud assembly by display name, nested stage assemblies included."""
    manifest = json.loads((assembly / "manifest.json").read_text())
    templates = {}
    for artifact in manifest["artifacts"].values():
        if artifact["type"] == "aws:cloudformation:stack":
            templates[artifact["displayName"]] = json.loads(
                (assembly / artifact["properties"]["templateFile"]).read_text())
        elif artifact["type"] == "cdk:cloud-assembly":
            templates.update(read_templates(assembly / artifact["properties"]["directoryName"]))
    return templates


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory):
    """`synthesized("prod")` gives that configuration's synthesized app, built at most once per session."""
    cache: dict[str, Synthesized] = {}

    def get(name: str) -> Synthesized:
        if name not in cache:
            env_name, overrides = CONFIGURATIONS[name]
            cache[name] = synthesize(tmp_path_factory.mktemp(f"cdk-{name}"), env_name, overrides)
        return cache[name]

    return get


def prerequisite(available: bool, missing: str) -> pytest.MarkDecorator:
    """Mark tests that need a tool: skipped with `missing` as the reason on a desk without it, failed under
    CI=true, so a machine that lost a tool cannot turn tests into skips unnoticed (`make test` installs them)."""
    if available:
        return pytest.mark.skipif(False, reason=missing)  # a mark that does nothing (usefixtures() warns on pytest 9)
    if os.environ.get("CI", "").lower() == "true":
        return pytest.mark.missing_prerequisite(missing)
    return pytest.mark.skip(reason=missing)


# A test module that imports one of these in its own process (at the top or inside a test), or uses the
# `synthesized` fixture or tests/test_cli.py's `app_main`, starts jsii (about 5 s) and synthesizes in-process.
CDK_IN_PROCESS = re.compile(r"^\s*(from (aws_cdk|cdk_nag|constructs|stacks)\b|import (aws_cdk|cdk_nag|constructs|"
                            r"app)\b)|\b(synthesized|app_main)\b", re.MULTILINE)
CDK_GROUP = "synthesizes in-process"


# Modules that share a session fixture costly to build run on one worker, so it is built once.
SHARED_FIXTURE_GROUPS = {"tests/inference/test_arm_check.py": "tests/inference/test_calibration.py"}  # `exported`


@functools.cache
def xdist_group(module_path: str) -> str:
    """The worker group of a test module under `make test`: its own, the one every in-process CDK module shares
    (jsii then starts once, and each configuration of `synthesized` is built once), or the one it shares a costly
    fixture with (SHARED_FIXTURE_GROUPS)."""
    path = REPO_ROOT / module_path
    if CDK_IN_PROCESS.search(path.read_text() if path.is_file() else ""):
        return CDK_GROUP
    return SHARED_FIXTURE_GROUPS.get(module_path, module_path)


# The longest groups, longest first (wall seconds under `make test` on the 2-vCPU Xeon, `pytest --durations=0`
# summed by group): the scheduler hands groups out in collection order, longest first, and a 30 s group handed out
# last keeps one worker busy while the other idles. xdist's own order (most tests first) put these last.
LONGEST_GROUPS = (
    CDK_GROUP,  # 61 s
    "tests/training/test_bench_train.py",  # 40 s
    "tests/training/test_compile.py",  # 32 s
    "tests/training/test_sagemaker_entry.py",  # 28 s
    "tests/inference/test_server.py",  # 27 s
    "tests/inference/test_benchmark_server.py",  # 25 s
    "tests/falcon_benchmark/test_benchmark.py",  # 15 s
    "tests/inference/test_signals.py",  # 15 s
    "tests/training/test_train.py",  # 12 s
    "tests/training/test_distributed.py",  # 12 s
    "tests/inference/test_precision.py",  # 11 s
    "tests/inference/test_calibration.py",  # 11 s, with test_arm_check (SHARED_FIXTURE_GROUPS)
    "tests/training/test_quiet_first_commands.py",  # 11 s
    "tests/loadtest/test_streaming.py",  # 10 s
)


def longest_groups_first(items: list) -> None:
    """Reorder `items` in place: the groups of LONGEST_GROUPS in that order, then the rest as collected."""
    rank = {group: position for position, group in enumerate(LONGEST_GROUPS)}
    items.sort(key=lambda item: rank.get(xdist_group(item.nodeid.split("::", 1)[0]), len(rank)))


if importlib.util.find_spec("xdist") is not None:  # the CPython 3.13 venv has no xdist, and pytest refuses its hook

    def pytest_collection_modifyitems(config, items):
        if hasattr(config, "workerinput"):  # an xdist worker: its collection order is the order groups are handed out
            longest_groups_first(items)

    def pytest_xdist_make_scheduler(config, log):
        """`--dist loadscope` with our groups: each module's tests on one worker, so a module-scoped fixture (a
        server, a two-node run) is built once, and the in-process CDK modules together (`xdist_group`); the
        longest groups are handed out first (LONGEST_GROUPS)."""
        if config.getvalue("dist") != "loadscope":
            return None
        from xdist.scheduler import LoadScopeScheduling

        config.option.loadscopereorder = False  # keep the workers' order, longest first

        class ModuleGroups(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return xdist_group(nodeid.split("::", 1)[0])

        return ModuleGroups(config, log)


@pytest.fixture(autouse=True)
def _root_logging_as_it_was():
    """A CLI's main() run in-process configures the root logger (train_sentiment: `basicConfig(force=True)`) with a
    handler on the stream pytest captured for that test, closed once the test ends; a later test's log line then
    fails inside logging and prints the failing frame's source to stderr (a fresh-clone run saw a test's secret in
    it). After each test, a plain stream handler it added to the root logger goes, and the root's level is restored
    (pytest's own capture handlers come and go with each phase: left to pytest)."""
    import logging

    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if type(handler) is logging.StreamHandler and handler not in before:
            root.removeHandler(handler)
    root.setLevel(level)


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("missing_prerequisite")
    if marker is not None:
        pytest.fail(f"CI=true and a prerequisite is missing: {marker.args[0]}", pytrace=False)
