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
