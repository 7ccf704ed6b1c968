"""The whole of one environment's settings: top-level values and one section per concern."""

from __future__ import annotations

from settings.fields import AwsAccount, AwsRegion, section, setting, text
from settings.network import ArtifactSettings, NetworkSettings
from settings.operations import OperationsSettings, PipelineSettings
from settings.serving import FalconSettings, SentimentSettings
from settings.training import TrainingSettings

ProjectName = text(r"^[a-z][a-z0-9-]{1,20}$", "lowercase letters, digits and '-', 2 to 21 characters")


@section
class Settings:
    """Everything one environment deploys; built only through `load_settings`."""

    name: str
    project: ProjectName = setting("mlrecipes", "prefix of stack names and tags")
    region: AwsRegion = setting("us-west-2", "the environment's region")
    account: AwsAccount | None = setting(None, "the environment's account; none: account-agnostic")
    network: NetworkSettings = setting(NetworkSettings, "VPC")
    artifacts: ArtifactSettings = setting(ArtifactSettings, "artifact bucket")
    training: TrainingSettings = setting(TrainingSettings, "training run")
    sentiment: SentimentSettings = setting(SentimentSettings, "sentiment endpoint")
    falcon: FalconSettings = setting(FalconSettings, "Falcon LMI endpoint")
    operations: OperationsSettings = setting(OperationsSettings, "operations")
    pipeline: PipelineSettings = setting(PipelineSettings, "delivery pipeline")
    allow_unpatched_images: bool = setting(False, "deploy images past their vendor's end of patch "
                                                  "(settings/patch_windows.py); synth warns instead of refusing")

    @property
    def stack_prefix(self) -> str:
        return f"{self.project}-{self.name}"

    @property
    def tags(self) -> dict[str, str]:
        return {"project": self.project, "environment": self.name}
