"""The training image named in training/requirements.txt, and what its tag says it runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REQUIREMENTS = Path(__file__).parent / "requirements.txt"
MARKER = "# base-image:"
# AWS's Amazon Linux 2023 PyTorch training tags for EC2: <torch>-cu<cuda>-amzn2023. Their Python is not in the tag:
# every one of them (2.11-2.13) runs Python 3.12 (docs/src/data/pytorch/2.1x-cuda-ec2.yml `python: py312`).
TAG = re.compile(r"^(?P<torch>\d+\.\d+\.\d+)-cu(?P<cuda>\d+)-amzn2023$")
PYTHON = "3.12"


@dataclass(frozen=True)
class BaseImage:
    repository: str
    tag: str
    torch: str
    python: str
    cuda: str


def base_image(path: Path = REQUIREMENTS) -> BaseImage:
    """The `# base-image: repository:tag` line of the requirements file, with the versions its tag encodes."""
    lines = [line[len(MARKER):].strip() for line in path.read_text().splitlines() if line.startswith(MARKER)]
    if len(lines) != 1:
        raise ValueError(f"{path}: expected one '{MARKER} repository:tag' line, found {len(lines)}")
    repository, _, tag = lines[0].partition(":")
    match = TAG.match(tag)
    if not match:
        raise ValueError(f"{path}: base image tag {tag!r} is not a '<torch>-cuNNN-amzn2023' tag")
    cuda = match["cuda"]
    return BaseImage(repository, tag, match["torch"], PYTHON, f"{cuda[:-1]}.{cuda[-1]}")
