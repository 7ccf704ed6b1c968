"""training/requirements.txt names the training image; the Dockerfile and the settings must agree with it."""

from __future__ import annotations

import re

import pytest

from settings import REPO_ROOT
from settings.training import TrainingSettings
from training.image import base_image


def test_requirements_name_the_image_and_its_torch():
    image = base_image()
    assert image.repository == "pytorch"
    assert (image.torch, image.python, image.cuda) == ("2.13.0", "3.12", "13.3")


def test_the_gpu_image_runs_the_torch_the_cpu_tests_run():
    from importlib import metadata

    assert metadata.version("torch").split("+")[0] == base_image().torch


def test_dockerfile_default_base_image_is_the_named_one():
    image = base_image()
    dockerfile = (REPO_ROOT / "training" / "Dockerfile").read_text()
    defaults = re.findall(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, flags=re.MULTILINE)
    assert len(defaults) == 1
    assert defaults[0].endswith(f"/{image.repository}:{image.tag}")


def test_training_setting_runs_the_named_image():
    assert TrainingSettings().base_image_tag == base_image().tag


def test_training_and_serving_pin_the_same_transformers():
    from inference.sentiment.image import supply_chain

    training = supply_chain.pins(REPO_ROOT / "training" / "requirements.txt")
    assert training["transformers"] == supply_chain.pins(supply_chain.REQUIREMENTS)["transformers"]


def test_a_requirements_file_without_the_line_or_with_a_bad_tag_is_refused(tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_text("transformers==5.20.0\n")
    with pytest.raises(ValueError, match="expected one '# base-image: repository:tag' line, found 0"):
        base_image(path)
    path.write_text("# base-image: pytorch:latest\n")
    with pytest.raises(ValueError, match="'latest' is not a"):
        base_image(path)


def test_sagemaker_backend_runs_the_same_image_release():
    """The SageMaker flavour of the named image: same torch minor version and CUDA, with the -sagemaker suffix."""
    image = base_image()
    minor = ".".join(image.torch.split(".")[:2])
    assert TrainingSettings().sagemaker_image_tag == f"{minor}-cu{image.cuda.replace('.', '')}-amzn2023-sagemaker"
