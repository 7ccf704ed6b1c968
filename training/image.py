"""The training image named in training/requirements.txt, and what its tag says it runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REQUIREMENTS = Path(__file__).parent / "requirements.txt"
MARKER = "# base-image:"
# Deep Learning Container tags for EC2 training: <torch>-gpu-py<major><minor>-cu<cuda>-<os>-ec2.
TAG = re.compile(r"^(?P<torch>\d+\.\d+\.\d+)-gpu-py(?P<py>3)(?P<minor>\d+)-cu(?P<cuda>\d+)-(?P<os>ubuntu[\d.]+)-ec2$")


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
        raise ValueError(f"{path}: base image tag {tag!r} is not a '<torch>-gpu-py3NN-cuNNN-ubuntuNN.NN-ec2' tag")
    cuda = match["cuda"]
    return BaseImage(repository, tag, match["torch"], f"{match['py']}.{match['minor']}", f"{cuda[:-1]}.{cuda[-1]}")
