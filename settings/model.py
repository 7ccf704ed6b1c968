"""The whole of one environment's settings: top-level values and one section per concern."""

from __future__ import annotations

from settings.fields import ACCOUNT, REGION, section, setting
from settings.network import ArtifactSettings, NetworkSettings
from settings.operations import OperationsSettings, PipelineSettings
from settings.serving import FalconSettings, SentimentSettings
from settings.training import TrainingSettings


@section
class Settings:
    """Everything one environment deploys; built only through `load_settings`."""

    name: str
    project: str = setting("mlrecipes", pattern=r"^[a-z][a-z0-9-]{1,20}$",
                           allowed="lowercase letters, digits and '-', 2 to 21 characters",
                           description="prefix of stack names and tags")
    region: str = setting("us-west-2", pattern=REGION, allowed="an AWS region name such as us-west-2",
                          description="the environment's region")
    account: str | None = setting(None, pattern=ACCOUNT, allowed="a 12-digit AWS account id",
                                  description="the environment's account; none: environment-agnostic stacks")
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
