"""Which wheels the model archive carries: the Python and platform of the configured hosting image.

The endpoint runs with network isolation, so `pip download` on the training instance fetches the handler's
wheels (inference/sentiment/requirements.txt) for the sentiment image, not for the training image. Python comes from
the image tag (FACTS: the 2.4.0 Graviton image runs Python 3.11, the 2.6.0 arm64 image Python 3.12);
the platform is linux aarch64 (Graviton). A combination that cannot work is refused at synth.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from settings import REPO_ROOT, SettingsError

INFERENCE_REQUIREMENTS = REPO_ROOT / "inference" / "sentiment" / "requirements.txt"
# glibc 2.35 (Ubuntu 22.04) on arm64 installs both tags; pip tries them in order.
AARCH64_PLATFORMS = ("manylinux_2_28_aarch64", "manylinux2014_aarch64")
# What each pinned transformers release requires of its host, from its wheel's METADATA
# (transformers 5.20.0: `Requires-Python: >=3.10.0`, `Requires-Dist: torch>=2.6`).
TRANSFORMERS_NEEDS: dict[str, dict[str, tuple[int, ...]]] = {
    "5.20.0": {"python": (3, 10), "torch": (2, 6)},
}


@dataclass(frozen=True)
class WheelTarget:
    python: str
    platforms: tuple[str, ...]

    def platform_flags(self) -> str:
        """`--platform X --platform Y` for pip download."""
        return " ".join(f"--platform {platform}" for platform in self.platforms)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def pinned(name: str, path: Path = INFERENCE_REQUIREMENTS) -> str:
    """The `name==version` pin in a requirements file."""
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise ValueError(f"{path} pins no {name}")


def wheel_target(pytorch_version: str, images: dict[str, tuple[str, str, str]],
                 transformers_version: str | None = None) -> WheelTarget:
    """Python and platforms of the sentiment image for `pytorch_version`, or SettingsError if it cannot host
    the handler's pinned transformers."""
    key = "sentiment.pytorch_version"
    if pytorch_version not in images:
        raise SettingsError(key, pytorch_version, "one of " + ", ".join(sorted(images)))
    _, tag, python = images[pytorch_version]
    if f"-py{python.replace('.', '')}-" not in tag:
        raise ValueError(f"image tag {tag} does not run Python {python}")
    transformers_version = transformers_version or pinned("transformers")
    needs = TRANSFORMERS_NEEDS.get(transformers_version)
    if needs is None:
        raise ValueError(f"transformers {transformers_version} (inference/sentiment/requirements.txt) is not in "
                         "stacks/serving_wheels.py TRANSFORMERS_NEEDS: add what its METADATA requires")
    if _version(python)[:2] < needs["python"]:
        raise SettingsError(key, pytorch_version,
                            f"an image whose Python runs transformers {transformers_version} (Python >= "
                            f"{'.'.join(map(str, needs['python']))}; this image has {python})")
    if _version(pytorch_version)[:2] < needs["torch"]:
        allowed = [v for v in sorted(images) if _version(v)[:2] >= needs["torch"]]
        raise SettingsError(key, pytorch_version,
                            f"an image with torch >= {'.'.join(map(str, needs['torch']))}, which transformers "
                            f"{transformers_version} (inference/sentiment/requirements.txt) requires: "
                            + ", ".join(allowed))
    return WheelTarget(python, AARCH64_PLATFORMS)
