"""Powertools for AWS Lambda as a layer built from the pinned Python package, offline, at synth.

The public layer's SSM parameter (/aws/service/powertools/python/...) is resolved at deploy time, and a version
whose parameter was not published fails the change set (Powertools issue #7689, fixed by PR #7695). Building the
layer from the package the project already pins needs neither the parameter nor a network at synth.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import tempfile
from pathlib import Path

from settings import REPO_ROOT, SettingsError

# Packages the layer holds: Powertools and its two required dependencies (pure Python, any architecture).
# boto3 and botocore come with the Lambda Python runtime.
LAYER_DISTRIBUTIONS = ("aws-lambda-powertools", "jmespath", "typing-extensions")
LAYER_ROOT = REPO_ROOT / "build" / "powertools-layer"


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("aws-lambda-powertools")
    except importlib.metadata.PackageNotFoundError:
        return None


def layer_directory(version: str, root: Path = LAYER_ROOT) -> Path:
    """A folder laid out as a Lambda Python layer (python/<package>), built once per version and reused.

    Raises SettingsError when the installed Powertools is not `version` (the layer must be what was tested).
    """
    installed = installed_version()
    if installed != version:
        raise SettingsError("operations.powertools_version", version,
                            f"the installed aws-lambda-powertools version ({installed or 'not installed'}; "
                            "pinned in requirements.txt)")
    target = root / version
    if (target / "python").is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=root))
    for distribution in LAYER_DISTRIBUTIONS:
        for top in _top_level(distribution):
            source = Path(importlib.metadata.distribution(distribution).locate_file(top))
            destination = staging / "python" / top
            if source.is_dir():
                shutil.copytree(source, destination, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, destination)
    try:
        staging.rename(target)  # atomic: a concurrent synth either sees a whole layer or builds its own
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _top_level(distribution: str) -> list[str]:
    """The importable top-level packages or modules a distribution installed (from its RECORD)."""
    files = importlib.metadata.distribution(distribution).files or []
    tops = set()
    for file in files:
        first = file.parts[0]
        if first.endswith((".dist-info", ".data")) or first == ".." or first == "__pycache__":
            continue
        tops.add(first)
    return sorted(tops)
