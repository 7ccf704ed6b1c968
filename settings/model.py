"""The whole of one environment's settings: top-level values and one section per concern."""

from __future__ import annotations

from pydantic import model_validator

from settings.fields import AwsAccount, AwsRegion, SettingsError, section, setting, text
from settings.network import ArtifactSettings, NetworkSettings
from settings.operations import OperationsSettings, PipelineSettings
from settings.serving import FalconSettings, SentimentSettings
from settings.training import EC2_IMAGE_TAGS, MISSING_IN_REGIONS, SAGEMAKER_IMAGE_TAGS, TrainingSettings, image_release

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

    @model_validator(mode="after")
    def _training_image_in_region(self) -> Settings:
        """The training image the environment deploys (settings.patch_windows.deployed_images' rule) must exist in
        its region."""
        training = self.training
        for key, tag, offered, deployed in (
                ("training.base_image_tag", training.base_image_tag, EC2_IMAGE_TAGS,
                 training.enabled and training.backend == "ec2"),
                ("training.sagemaker_image_tag", training.sagemaker_image_tag, SAGEMAKER_IMAGE_TAGS,
                 training.backend == "sagemaker")):
            if deployed and self.region in MISSING_IN_REGIONS.get(image_release(tag), ()):
                there = [t for t in offered if self.region not in MISSING_IN_REGIONS.get(image_release(t), ())]
                raise SettingsError(key, tag, f"one of {', '.join(there)} in region {self.region} (the SageMaker "
                                              f"SDK's image table has no {image_release(tag)} there)")
        return self

    @property
    def stack_prefix(self) -> str:
        return f"{self.project}-{self.name}"

    @property
    def tags(self) -> dict[str, str]:
        return {"project": self.project, "environment": self.name}
