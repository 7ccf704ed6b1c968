"""All stacks of one environment, and the one place they are wired together."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import aws_cdk as cdk
from constructs import Construct

from settings import CDK_JSON, Settings
from stacks.artifacts import ArtifactsStack
from stacks.network import NetworkStack
from stacks.operations import OperationsStack


@dataclass
class EnvironmentStacks:
    artifacts: ArtifactsStack
    network: NetworkStack
    optional: dict[str, cdk.Stack] = field(default_factory=dict)


def build_environment(scope: Construct, settings: Settings) -> EnvironmentStacks:
    """Stacks for `settings`: storage and network always; workloads only when their section is enabled."""
    from settings import patch_windows

    for warning in patch_windows.check(patch_windows.deployed_images(settings),
                                       allow_unpatched=settings.allow_unpatched_images):
        print(f"warning: {settings.name}: {warning}", file=sys.stderr)
    artifacts = ArtifactsStack(scope, settings=settings)
    network = NetworkStack(scope, settings=settings, key=artifacts.key)
    stacks = EnvironmentStacks(artifacts=artifacts, network=network)
    stacks.optional["operations"] = OperationsStack(scope, settings=settings, artifacts=artifacts)
    # Workload stacks are imported only when enabled, so a disabled one costs nothing at synth.
    if settings.training.enabled and settings.training.backend == "ec2":
        from stacks.training import TrainingStack

        stacks.optional["training"] = TrainingStack(
            scope, settings=settings, vpc=network.vpc, artifacts=artifacts)
    # The SageMaker backend's pipeline costs nothing until `make train` starts an execution, so it needs no switch.
    if settings.training.backend == "sagemaker":
        from stacks.sagemaker_pipeline import SageMakerTrainingStack

        stacks.optional["sagemaker_training"] = SageMakerTrainingStack(
            scope, settings=settings, vpc=network.vpc, artifacts=artifacts)
    if settings.sentiment.enabled:
        from stacks.sentiment import SentimentStack

        stacks.optional["sentiment"] = SentimentStack(
            scope, settings=settings, vpc=network.vpc, key=artifacts.key, alarm_topic=artifacts.alarm_topic)
    if settings.falcon.enabled:
        from stacks.falcon import FalconStack

        stacks.optional["falcon"] = FalconStack(
            scope, settings=settings, vpc=network.vpc, key=artifacts.key, alarm_topic=artifacts.alarm_topic)
    return stacks


def new_app(context: dict[str, Any] | None = None, outdir: str | None = None) -> cdk.App:
    """An App that sees cdk.json's feature flags even when run without the CLI (tests, tools).

    Context from the CLI and cdk.json takes precedence over what is passed here, so this changes
    nothing under `cdk synth`; it only makes `python app.py` and tests behave the same way.
    """
    flags = {k: v for k, v in json.loads(CDK_JSON.read_text())["context"].items() if k.startswith("@")}
    return cdk.App(context={**flags, **(context or {})}, outdir=outdir)


def build_app(app: cdk.App) -> Settings:
    """Everything `app.py` synthesizes for the app's context: one environment's stacks, or the pipeline.

    Raises SettingsError for bad settings, including what only a stack can check (GPU memory, instance families).
    """
    from settings import load_settings, overrides_from_context, settings_from_context

    context = app.node.get_all_context()
    settings = settings_from_context(context)
    if settings.pipeline.enabled:
        from stacks.pipeline import PipelineStack

        overrides = overrides_from_context(context)
        stages = [load_settings(name, overrides) for name in settings.pipeline.stages]
        PipelineStack(app, settings=settings, stages=stages, overrides=overrides)
    else:
        build_environment(app, settings)
    return settings
