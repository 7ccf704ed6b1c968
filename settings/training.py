"""The sentiment model's training run (EC2 recipe or SageMaker backend)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from settings.fields import Ec2InstanceType, LogRetentionDays, SettingsError, section, setting, text

RunId = text(r"^[a-z0-9][a-z0-9-]{0,47}$", "lowercase letters, digits and '-', at most 48 characters")
SsmPublicParameter = text(r"^/aws/service/.+", "a public SSM parameter name under /aws/service/")
AvailabilityZone = text(r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$", "a zone name such as us-west-2a")
CapacityReservation = text(r"^cr-[0-9a-f]{8,17}$", "a capacity reservation id such as cr-0123456789abcdef0")
# The Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023): driver, Docker and the NVIDIA container
# toolkit, to run the Amazon Linux 2023 PyTorch training image below. Resolved by CloudFormation at deploy time.
DLAMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
# AWS's Amazon Linux 2023 PyTorch training images (repository `pytorch`), as AWS's support data names them
# (aws/deep-learning-containers docs/src/data/pytorch/2.1x-cuda-{ec2,sagemaker}.yml `tags`: 2.11-2.13 at e0ecedea,
# 2.14 at dee632b1 (EC2) and 1f8757ef (SageMaker)); newest first. Each has a patch-window row in
# settings/patch_windows.py. The SageMaker tags are the ones sagemaker-core 2.27's
# image_uris.retrieve(framework="pytorch-amzn2023", image_scope="training") returns (tests/test_training_images.py).
EC2_IMAGE_TAGS = ("2.14.0-cu133-amzn2023", "2.13.0-cu133-amzn2023", "2.12.1-cu130-amzn2023", "2.11.0-cu130-amzn2023")
SAGEMAKER_IMAGE_TAGS = ("2.14-cu133-amzn2023-sagemaker", "2.13-cu133-amzn2023-sagemaker",
                        "2.12-cu130-amzn2023-sagemaker", "2.11-cu130-amzn2023-sagemaker")
# The default stays 2.13, the release whose image our training setup was checked against (its Dockerfile,
# entrypoint, EFA install and pyproject at e0ecedea: docs/training.md, "Training images"). 2.14 is offered: its data
# files give the same Python (py312) and CUDA (cu133) and a later end of patch (2027-09-28), but its image was not
# read here, and moving the default would change every environment's next training run.
DEFAULT_EC2_IMAGE_TAG = "2.13.0-cu133-amzn2023"
DEFAULT_SAGEMAKER_IMAGE_TAG = "2.13-cu133-amzn2023-sagemaker"
# Regions without an image of that release: sagemaker-core 2.27's pytorch-amzn2023 table lists no China or GovCloud
# registry for 2.14 (it does for 2.11-2.13; tests/test_training_images.py compares). No table of ours says where the
# EC2 flavour is, so both backends refuse 2.14 there (settings.model).
MISSING_IN_REGIONS = {"2.14": ("cn-north-1", "cn-northwest-1", "us-gov-east-1", "us-gov-west-1")}


def image_release(tag: str) -> str:
    """`2.14.0-cu133-amzn2023` or `2.14-cu133-amzn2023-sagemaker` -> `2.14`."""
    return ".".join(tag.split("-")[0].split(".")[:2])


@section
class TrainingSettings:
    enabled: bool = setting(False, "start the paid GPU training run on deploy (always explicit)")
    instance_type: Ec2InstanceType = setting("p4d.24xlarge", "GPU instance (ml. prefixed for SageMaker)")
    run_id: RunId = setting("run-0001", "names the run's outputs; a new id means a new run")
    volume_gib: int = setting(200, "root volume of the EC2 instance", ge=50, le=16384, unit="GiB")
    max_hours: int = setting(6, "the run stops itself after this", ge=1, le=72, unit="hours")
    log_retention_days: LogRetentionDays = setting(30, "training log retention", unit="days")
    ami_parameter: SsmPublicParameter = setting(DLAMI, "SSM parameter holding the Deep Learning AMI id")
    base_image_tag: Literal[EC2_IMAGE_TAGS] = setting(DEFAULT_EC2_IMAGE_TAG,
                                                      "pytorch DLC tag (Amazon Linux 2023), EC2 run")
    base_model: str = setting("cardiffnlp/twitter-roberta-base-sep2022", "Hugging Face model to tune")
    epochs: int = setting(10, "training epochs", ge=1, le=100)
    learning_rate: float = setting(1e-5, "peak learning rate", ge=1e-7, le=1e-2)
    per_device_batch_size: int = setting(16, "batch size per GPU (train and eval)", ge=1, le=1024)
    max_length: int = setting(128, "padded sequence length", ge=8, le=512, unit="tokens")
    max_train_samples: int | None = setting(None, "a slice of the training data; none: all", ge=1, le=10_000_000)
    max_eval_samples: int | None = setting(None, "a slice of the evaluation data; none: all", ge=1, le=10_000_000)
    availability_zone: AvailabilityZone | None = setting(None, "where P-instance capacity is; none: 1st private subnet")
    capacity_reservation_id: CapacityReservation | None = setting(None, "ODCR or Capacity Block to launch into")
    backend: Literal["ec2", "sagemaker"] = setting("ec2", "one self-terminating EC2 instance, or a SageMaker Pipeline")
    instance_count: int = setting(1, "SageMaker backend: instances, torchrun across all", ge=1, le=64)
    spot: bool = setting(False, "SageMaker managed spot training")
    spot_max_wait_hours: int | None = setting(None, "spot wait incl. runtime; none: 2 x max_hours", ge=1, le=72,
                                              unit="hours")
    min_macro_recall: float = setting(0.6, "registration needs this validation recall", ge=0.0, le=1.0)
    sagemaker_image_tag: Literal[SAGEMAKER_IMAGE_TAGS] = setting(DEFAULT_SAGEMAKER_IMAGE_TAG,
                                                                 "pytorch DLC tag (Amazon Linux 2023), SageMaker")

    @model_validator(mode="after")
    def _backend_rules(self) -> TrainingSettings:
        if self.backend == "ec2" and self.instance_count != 1:
            raise SettingsError("training.instance_count", self.instance_count,
                                "1 with training.backend=ec2 (multi-node needs training.backend=sagemaker)")
        if self.backend == "ec2" and self.spot:
            raise SettingsError("training.spot", self.spot, "false with training.backend=ec2 (managed spot "
                                "needs training.backend=sagemaker)")
        if self.spot_max_wait_hours is not None and self.spot_max_wait_hours < self.max_hours:
            raise SettingsError("training.spot_max_wait_hours", self.spot_max_wait_hours,
                                f"at least training.max_hours ({self.max_hours}), or unset")
        return self

    @property
    def sagemaker_instance_type(self) -> str:
        return f"ml.{self.instance_type}"

    @property
    def spot_wait_hours(self) -> int:
        """MaxWaitTimeInSeconds in hours: the setting, or twice the runtime limit (72 h at most)."""
        return self.spot_max_wait_hours or min(2 * self.max_hours, 72)
