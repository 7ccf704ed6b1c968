"""Every image we deploy has a vendor end-of-patch date with its source; synth warns 90 days before it and refuses
after it unless `allow_unpatched_images=true` (issue 21, item 6)."""

from __future__ import annotations

import json
import re
from datetime import date, timedelta

import pytest

from settings import SettingsError, load_settings
from settings.patch_windows import TODAY_ENV, WARN_DAYS, WINDOWS, check, deployed_images
from settings.serving import LMI_VERSIONS
from tests.conftest import REPO_ROOT
from tests.test_cli import app_main

MODEL = "s3://my-bucket/models/sentiment/run-1/model.tar.gz"
BASE = "python:3.13-slim-trixie"


def test_every_row_has_a_date_and_a_source_and_every_offered_image_has_a_row():
    for key, window in WINDOWS.items():
        assert isinstance(window.end_of_patch, date) and len(window.source) > 20, key
    assert {f"djl-inference:{version}" for version in LMI_VERSIONS} <= set(WINDOWS)
    assert BASE in WINDOWS
    assert not any(key.startswith("pytorch-inference") for key in WINDOWS)  # the retired TorchServe images (issue 43)
    dockerfile = (REPO_ROOT / "inference" / "sentiment" / "image" / "Dockerfile").read_text()
    assert re.search(rf"^ARG BASE_IMAGE=\S+/{re.escape(BASE)}@sha256:[0-9a-f]{{64}}$", dockerfile, re.M)


def test_the_default_images_of_every_workload_are_known():
    settings = load_settings("prod", {"training.enabled": True, "sentiment.enabled": True, "falcon.enabled": True,
                                      "sentiment.model_data_url": MODEL})
    images = deployed_images(settings)
    assert set(images) == {"pytorch:2.13-ec2", BASE, "djl-inference:0.36.0-lmi27"}
    assert images[BASE] == "sentiment.enabled=true"
    sagemaker = load_settings("prod", {"training.backend": "sagemaker"})
    assert set(deployed_images(sagemaker)) == {"pytorch:2.13-sagemaker"}


@pytest.mark.parametrize(("days_before", "warned"), [(WARN_DAYS + 1, False), (WARN_DAYS, True),
                                                     (WARN_DAYS - 1, True), (1, True), (0, True)])
def test_a_warning_within_90_days_of_the_end_and_none_before(days_before, warned):
    end = WINDOWS[BASE].end_of_patch
    warnings = check({BASE: "sentiment.enabled=true"}, allow_unpatched=False, on=end - timedelta(days_before))
    assert bool(warnings) is warned
    if warned:
        [line] = warnings
        assert f"ends patching on {end}, in {days_before} days" in line and "wiki.debian.org" in line


def test_after_the_end_synth_refuses_in_one_line_unless_allowed():
    window = WINDOWS["djl-inference:0.23.0"]
    after = window.end_of_patch + timedelta(days=1)
    with pytest.raises(SettingsError) as refused:
        check({"djl-inference:0.23.0": "falcon.lmi_version=0.23.0"}, allow_unpatched=False, on=after)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("invalid setting falcon.lmi_version='0.23.0': expected an image inside its patch window")
    assert "ended patching on 2024-07-14 (source: no vendor end-of-patch date (aws/deep-learning-containers " \
           "e0ecedea: docs/src/data/djl-inference/*.yml carry no eop); derived: GA + 1 year" in message
    assert message.endswith("set allow_unpatched_images=true to deploy it anyway")
    [warning] = check({"djl-inference:0.23.0": "falcon.lmi_version=0.23.0"}, allow_unpatched=True, on=after)
    assert "ended patching on 2024-07-14, 1 days ago; deployed because allow_unpatched_images=true" in warning


def test_an_image_without_a_window_is_refused():
    with pytest.raises(SettingsError, match=r"training.base_image_tag='2.7.0-gpu-x-ec2': expected an image with a "
                                            r"known patch window"):
        check({"pytorch-training:2.7-ec2": "training.base_image_tag=2.7.0-gpu-x-ec2"}, allow_unpatched=True)


def test_a_bad_date_for_the_check_is_one_line(monkeypatch):
    monkeypatch.setenv(TODAY_ENV, "next tuesday")
    with pytest.raises(SettingsError, match=r"invalid setting PATCH_WINDOW_TODAY='next tuesday': expected a date"):
        check({BASE: "sentiment.enabled=true"}, allow_unpatched=False)


def test_synth_refuses_an_image_past_its_end_and_takes_it_with_the_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(TODAY_ENV, "2026-12-04")
    context = {"env": "dev", "falcon.enabled": "true", "falcon.lmi_version": "0.23.0"}
    assert app_main(context, tmp_path / "refused", monkeypatch) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: invalid setting falcon.lmi_version='0.23.0': expected an image inside its patch "
                           "window: djl-inference:0.23.0-deepspeed0.9.5-cu118 ended patching on 2024-07-14"), line
    assert app_main({**context, "allow_unpatched_images": "true"}, tmp_path / "allowed", monkeypatch) == 0
    assert (tmp_path / "allowed" / "manifest.json").is_file()
    days = (date(2026, 12, 4) - WINDOWS["djl-inference:0.23.0"].end_of_patch).days
    assert f"warning: dev: djl-inference:0.23.0-deepspeed0.9.5-cu118 ended patching on 2024-07-14, {days} days " \
           "ago" in capsys.readouterr().err
    # Our serving image (python:3.13-slim-trixie, 2028-08-09) is far off: the same check has no warning.
    ours = deployed_images(load_settings("dev", {"sentiment.enabled": "true", "sentiment.model_data_url": MODEL}))
    assert any(key.startswith("python:3.13-slim-trixie") for key in ours), ours
    assert check(ours, allow_unpatched=False) == []


def test_the_docs_table_matches_the_module():
    text = (REPO_ROOT / "docs" / "patch-windows.md").read_text()
    section = text.split("## The table today", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (`[^|]+) \| (\d{4}-\d\d-\d\d) \|", section, re.M)
    shown = {}
    for names, end in rows:
        keys = re.findall(r"`([^`]+)`", names.split(" (")[0])
        repository = keys[0].split(":")[0]
        for key in keys:  # `:2.10-sagemaker` continues the row's first repository
            shown[repository + key if key.startswith(":") else key] = end
    assert shown == {key: str(window.end_of_patch) for key, window in WINDOWS.items()}


@pytest.mark.parametrize("environment", ["dev", "staging", "prod", "smoke"])
def test_cdk_json_environments_deploy_only_patched_images_without_the_flag(environment):
    """On the day the table was checked, every declared environment, also with every workload on, passes unflagged."""
    declared = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]["environments"]
    assert set(declared) == {"dev", "staging", "prod", "smoke"}
    day = date(2026, 12, 4)
    settings = load_settings(environment)
    assert settings.allow_unpatched_images is False
    check(deployed_images(settings), allow_unpatched=False, on=day)
    everything = load_settings(environment, {"training.enabled": True, "sentiment.enabled": True,
                                             "falcon.enabled": True, "sentiment.model_data_url": MODEL})
    check(deployed_images(everything), allow_unpatched=False, on=day)
