"""The archive's wheels follow the configured hosting image; an image that cannot host the handler is refused."""

from __future__ import annotations

import pytest

from settings import SettingsError
from stacks.sentiment import GRAVITON_IMAGES
from stacks.serving_wheels import AARCH64_PLATFORMS, TRANSFORMERS_NEEDS, pinned, wheel_target


def test_default_image_gets_python_312_aarch64_wheels():
    target = wheel_target("2.6.0", GRAVITON_IMAGES)
    assert (target.python, target.platforms) == ("3.12", AARCH64_PLATFORMS)
    assert target.platform_flags() == "--platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64"


def test_torch_24_image_cannot_run_transformers_5():
    with pytest.raises(SettingsError) as caught:
        wheel_target("2.4.0", GRAVITON_IMAGES)
    assert caught.value.key == "sentiment.pytorch_version"
    assert "torch >= 2.6" in str(caught.value) and "2.6.0" in str(caught.value)


def test_python_follows_the_image_tag():
    images = {"2.7.0": ("pytorch-inference-arm64", "2.7.0-cpu-py313-ubuntu22.04-sagemaker", "3.13")}
    assert wheel_target("2.7.0", images).python == "3.13"
    too_old = {"2.7.0": ("pytorch-inference-arm64", "2.7.0-cpu-py39-ubuntu22.04-sagemaker", "3.9")}
    with pytest.raises(SettingsError, match=r"Python >= 3\.10; this image has 3\.9"):
        wheel_target("2.7.0", too_old)
    mismatched = {"2.7.0": ("pytorch-inference-arm64", "2.7.0-cpu-py312-ubuntu22.04-sagemaker", "3.13")}
    with pytest.raises(ValueError, match=r"does not run Python 3\.13"):
        wheel_target("2.7.0", mismatched)


def test_an_unknown_transformers_pin_must_be_added_to_the_table():
    assert pinned("transformers") in TRANSFORMERS_NEEDS
    with pytest.raises(ValueError, match=r"not in stacks/serving_wheels\.py TRANSFORMERS_NEEDS"):
        wheel_target("2.6.0", GRAVITON_IMAGES, transformers_version="9.0.0")
