"""Instance sizes, without importing the CDK (tools and the smoke test use this too)."""

from __future__ import annotations

import re


def vcpus(instance_type: str) -> int:
    """vCPUs of an EC2 or SageMaker instance size: medium 1, large 2, xlarge 4, Nxlarge 4N."""
    size = instance_type.rsplit(".", 1)[-1]
    if size == "medium":
        return 1
    if size == "large":
        return 2
    match = re.fullmatch(r"(\d*)xlarge", size)
    if not match:
        raise ValueError(f"unknown instance size in {instance_type}")
    return 4 * int(match.group(1) or 1)


# Accelerated families with local NVMe instance storage, which the Deep Learning AMI mounts at /opt/dlami/nvme
# and SageMaker training uses as the job's volume (CreateTrainingJob then refuses a VolumeKmsKeyId).
INSTANCE_STORAGE_FAMILIES = ("g4dn", "g5", "g6", "g6e", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200",
                             "trn1", "trn1n", "trn2")
NVME_MOUNT = "/opt/dlami/nvme"


def has_instance_storage(instance_type: str) -> bool:
    """True for the families above, and for families that name their local disks with a "d" (c6gd, m5dn); an
    EC2 type or a SageMaker `ml.` one."""
    family = instance_type.removeprefix("ml.").split(".")[0]
    return family in INSTANCE_STORAGE_FAMILIES or bool(re.fullmatch(r"[a-z]+\d+[a-z]*d[n]?", family))

