"""The LMI image of a version in a region's Deep Learning Containers registry; no SDK call."""

from __future__ import annotations

from inference.llm.lmi.versions import REPOSITORY, container
from settings import SettingsError
from stacks.images import UnsupportedRegionError, dlc_image_uri, dlc_repository_arn


def image_uri(region: str, lmi_version: str) -> str:
    tag = container(lmi_version).tag  # an unknown version is a settings error, not a KeyError
    try:
        return dlc_image_uri(region, REPOSITORY, tag)
    except UnsupportedRegionError as error:
        raise SettingsError("region", region, "a region with a Deep Learning Containers registry") from error


def repository_arn(region: str) -> str:
    try:
        return dlc_repository_arn(region, REPOSITORY)
    except UnsupportedRegionError as error:
        raise SettingsError("region", region, "a region with a Deep Learning Containers registry") from error
