"""The whole of one environment's settings: top-level values and one section per concern."""

from __future__ import annotations

from settings.fields import AwsAccount, AwsRegion, section, setting, text
from settings.network import ArtifactSettings, NetworkSettings
from settings.operations import OperationsSettings, PipelineSettings
from settings.serving import FalconSettings, SentimentSettings
from settings.training import TrainingSettings


@section
class Settings:
    """Everything one environment deploys; built only through `load_settings`."""

    name: str
    project: text(r"^[a-z][a-z0-9-]{1,20}$", "lowercase letters, digits and '-', 2 to 21 characters") = setting(
        "mlrecipes", description="prefix of stack names and tags")
    region: AwsRegion = setting("us-west-2", description="the environment's region")
    account: AwsAccount | None = setting(None, description="the environment's account; none: account-agnostic")
    network: NetworkSettings = setting(default_factory=NetworkSettings, description="VPC")
    artifacts: ArtifactSettings = setting(default_factory=ArtifactSettings, description="artifact bucket")
    training: TrainingSettings = setting(default_factory=TrainingSettings, description="training run")
    sentiment: SentimentSettings = setting(default_factory=SentimentSettings, description="sentiment endpoint")
    falcon: FalconSettings = setting(default_factory=FalconSettings, description="Falcon LMI endpoint")
    operations: OperationsSettings = setting(default_factory=OperationsSettings, description="operations")
    pipeline: PipelineSettings = setting(default_factory=PipelineSettings, description="delivery pipeline")

    @property
    def stack_prefix(self) -> str:
        return f"{self.project}-{self.name}"

    @property
    def tags(self) -> dict[str, str]:
        return {"project": self.project, "environment": self.name}
