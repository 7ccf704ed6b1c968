"""Issue 31: both training backends run AWS's Amazon Linux 2023 PyTorch images (repository `pytorch`), each offered tag
has a patch-window row, the SageMaker image URI is sagemaker-core's, and synth on 2027-02-01 (after the Ubuntu image's
end of patch, 2027-01-21) warns about no training image."""

from __future__ import annotations

import re
from datetime import date

import pytest

from settings import load_settings
from settings.fields import SettingsError
from settings.patch_windows import TODAY_ENV, WINDOWS, check, deployed_images
from settings.training import EC2_IMAGE_TAGS, MISSING_IN_REGIONS, SAGEMAKER_IMAGE_TAGS, TrainingSettings
from stacks.environment import build_app, new_app
from stacks.images import DLC_ACCOUNTS, dlc_image_uri
from stacks.nag import add_checks
from stacks.sagemaker_training import TRAINING_REPOSITORY as SAGEMAKER_REPOSITORY
from stacks.training import TRAINING_REPOSITORY as EC2_REPOSITORY

AFTER_UBUNTU = "2027-02-01"


def _minor(tag: str) -> str:
    return ".".join(tag.split("-")[0].split(".")[:2])


def test_both_backends_use_the_amazon_linux_2023_repository_and_the_checked_release_by_default():
    assert EC2_REPOSITORY == SAGEMAKER_REPOSITORY == "pytorch"
    defaults = TrainingSettings()
    # 2.13 is the release whose image our training setup was read against (settings/training.py); 2.14, the newest
    # with AWS data files (sagemaker-core 2.27 knows it too), is offered, not the default.
    assert (defaults.base_image_tag, defaults.sagemaker_image_tag) == ("2.13.0-cu133-amzn2023",
                                                                       "2.13-cu133-amzn2023-sagemaker")
    assert (EC2_IMAGE_TAGS[0], SAGEMAKER_IMAGE_TAGS[0]) == ("2.14.0-cu133-amzn2023", "2.14-cu133-amzn2023-sagemaker")
    assert defaults.ami_parameter.endswith("/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id")
    assert [_minor(tag) for tag in EC2_IMAGE_TAGS] == [_minor(tag) for tag in SAGEMAKER_IMAGE_TAGS]


def test_every_offered_tag_has_a_patch_window_row_citing_its_data_file():
    for tags, platform in ((EC2_IMAGE_TAGS, "ec2"), (SAGEMAKER_IMAGE_TAGS, "sagemaker")):
        for tag in tags:
            window = WINDOWS[f"pytorch:{_minor(tag)}-{platform}"]
            assert f"docs/src/data/pytorch/{_minor(tag)}-cuda-{platform}.yml eop" in window.source
            assert re.search(r"aws/deep-learning-containers [0-9a-f]{8} docs/src/", window.source), window.source
    assert {WINDOWS[f"pytorch:2.14-{kind}"].end_of_patch for kind in ("ec2", "sagemaker")} == {date(2027, 9, 28)}
    assert not any(key.startswith("pytorch-training:") for key in WINDOWS), "the Ubuntu line is no longer offered"


@pytest.mark.parametrize("tag", SAGEMAKER_IMAGE_TAGS)
def test_sagemaker_image_uri_is_sagemaker_cores_in_every_supported_region(tag):
    """...and where sagemaker-core has none (MISSING_IN_REGIONS), settings refuse the tag: both lists must agree."""
    from sagemaker.core import image_uris

    for region in DLC_ACCOUNTS:
        def retrieve(region=region):
            return image_uris.retrieve(framework="pytorch-amzn2023", region=region, version=_minor(tag),
                                       instance_type="ml.p4d.24xlarge", image_scope="training")
        if region in MISSING_IN_REGIONS.get(_minor(tag), ()):
            with pytest.raises(ValueError, match="Unsupported region"):
                retrieve()
            with pytest.raises(SettingsError, match=f"in region {region}"):
                load_settings("dev", {"region": region, "training.backend": "sagemaker",
                                      "training.sagemaker_image_tag": tag})
        else:
            assert dlc_image_uri(region, SAGEMAKER_REPOSITORY, tag) == retrieve(), region


def test_2_14_is_offered_with_its_patch_window_and_refused_where_aws_lists_no_image():
    chosen = {"training.enabled": True, "training.base_image_tag": "2.14.0-cu133-amzn2023"}
    settings = load_settings("prod", chosen)
    images = deployed_images(settings)
    assert "pytorch:2.14-ec2" in images
    assert check(images, allow_unpatched=False, on=date(2027, 7, 1)) == [
        "pytorch 2.14 Amazon Linux 2023 (EC2) ends patching on 2027-09-28, in 89 days; move to a newer image before "
        "then (source: aws/deep-learning-containers dee632b1 docs/src/data/pytorch/2.14-cuda-ec2.yml eop)"]
    with pytest.raises(SettingsError) as error:
        load_settings("prod", {**chosen, "region": "us-gov-west-1"})
    assert str(error.value) == (
        "invalid setting training.base_image_tag='2.14.0-cu133-amzn2023': expected one of 2.13.0-cu133-amzn2023, "
        "2.12.1-cu130-amzn2023, 2.11.0-cu130-amzn2023 in region us-gov-west-1 (the SageMaker SDK's image table has "
        "no 2.14 there)")


@pytest.mark.parametrize("backend", ["ec2", "sagemaker"])
def test_no_training_image_is_near_its_end_of_patch_on_2027_02_01(backend):
    settings = load_settings("prod", {"training.enabled": True, "training.backend": backend})
    images = deployed_images(settings)
    assert [key for key in images if key.startswith("pytorch:")] == [f"pytorch:2.13-{backend}"]
    assert check(images, allow_unpatched=False, on=date.fromisoformat(AFTER_UBUNTU)) == []
    # The check is live: the oldest offered tag does warn by then (2.11 ends 2027-04-30, within 90 days).
    oldest = {"ec2": {"training.base_image_tag": EC2_IMAGE_TAGS[-1]},
              "sagemaker": {"training.sagemaker_image_tag": SAGEMAKER_IMAGE_TAGS[-1]}}[backend]
    older = load_settings("prod", {"training.enabled": True, "training.backend": backend, **oldest})
    [warning] = check(deployed_images(older), allow_unpatched=False, on=date.fromisoformat(AFTER_UBUNTU))
    assert "ends patching on 2027-04-30" in warning


@pytest.mark.parametrize("backend", ["ec2", "sagemaker"])
def test_synth_with_training_on_prints_no_patch_window_warning_after_the_ubuntu_image_ends(tmp_path, monkeypatch,
                                                                                          capfd, backend):
    """What `app.py` runs, in this process (tests/test_cli.py runs the app itself, once): nothing on stderr."""
    monkeypatch.setenv(TODAY_ENV, AFTER_UBUNTU)
    app = new_app(context={"env": "dev", "training.enabled": "true", "training.backend": backend},
                  outdir=str(tmp_path))
    build_app(app)
    add_checks(app)
    app.synth()
    assert "warning:" not in capfd.readouterr().err
    assert (tmp_path / "manifest.json").is_file()
