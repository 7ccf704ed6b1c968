"""GPUs of the SageMaker instance types LMI runs on, in what CUDA can allocate (GiB, 2**30 bytes)."""

from __future__ import annotations

from dataclasses import dataclass

from settings import SettingsError

GIB = 2**30


@dataclass(frozen=True)
class Gpu:
    name: str
    nominal_gib: int
    usable_gib: float  # what CUDA can allocate (nvidia-smi memory.total)


A10G = Gpu("A10G", 24, 23028 / 1024)  # GDDR6 with ECC: 15/16 of 24 GiB
L4 = Gpu("L4", 24, 23034 / 1024)
L40S = Gpu("L40S", 48, 46068 / 1024)
A100_40 = Gpu("A100 40GB", 40, 40960 / 1024)
A100_80 = Gpu("A100 80GB", 80, 81920 / 1024)
H100 = Gpu("H100", 80, 81559 / 1024)

_ONE_GPU = ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")
# family -> (GPU, {size: GPU count}, local NVMe instance storage)
GPU_INSTANCES: dict[str, tuple[Gpu, dict[str, int], bool]] = {
    "g5": (A10G, {**dict.fromkeys(_ONE_GPU, 1), "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}, True),
    "g6": (L4, {**dict.fromkeys(_ONE_GPU, 1), "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}, True),
    "g6e": (L40S, {**dict.fromkeys(_ONE_GPU, 1), "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}, True),
    "p4d": (A100_40, {"24xlarge": 8}, True),
    "p4de": (A100_80, {"24xlarge": 8}, True),
    "p5": (H100, {"48xlarge": 8}, True),
}


def gpu_instance(instance_type: str) -> tuple[Gpu, int]:
    """The GPU model and count of a SageMaker instance type, or SettingsError naming the ones known."""
    family, _, size = instance_type.removeprefix("ml.").partition(".")
    if family not in GPU_INSTANCES or size not in GPU_INSTANCES[family][1]:
        known = ", ".join(f"ml.{f}.*" for f in GPU_INSTANCES)
        raise SettingsError("falcon.instance_type", instance_type, f"a GPU instance type LMI runs on ({known})")
    gpu, sizes, _ = GPU_INSTANCES[family]
    return gpu, sizes[size]


def has_local_nvme(instance_type: str) -> bool:
    """Instance storage is local NVMe: SageMaker then rejects VolumeSizeInGB and an endpoint-config KmsKeyId."""
    family = instance_type.removeprefix("ml.").partition(".")[0]
    return family in GPU_INSTANCES and GPU_INSTANCES[family][2]
