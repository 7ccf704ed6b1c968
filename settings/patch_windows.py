"""How long each image we deploy gets security patches, and the synth check that warns and refuses.

One table, `WINDOWS`: for every image an environment can deploy, its vendor's end-of-patch date and where that
date comes from. Synth (`stacks.environment.build_environment`) asks `check` about the images the environment
deploys: within `WARN_DAYS` of the date it prints a warning; after the date it refuses, unless
`allow_unpatched_images=true`. Dates of AWS's Deep Learning Containers come from their support policy data at
aws/deep-learning-containers e0ecedea (2026-08-21): `docs/src/data/<repository>/<version>-....yml` (`ga`, `eop`)
and `docs/src/legacy/legacy_support.yml`; pytorch 2.14's files came later (dee632b1, 1f8757ef), which its rows
cite. LMI (DJL Serving) images are not in that table (their `djl-inference` files carry no `eop`) and the policy
text states no rule for them, so their dates are derived: GA + 1 year, the interval AWS's data gives every PyTorch
training release (pytorch-training 2.8-2.10 and pytorch 2.11-2.14: `eop` = `ga` + 1 year), with GA from the
release's DJL Serving branch or AWS's data commit; such rows say so.
Training runs on AWS's Amazon Linux 2023 `pytorch` images: the policy page at e0ecedea
(docs/src/templates/reference/support_policy.template.md) says Ubuntu-based PyTorch 2.8-2.10 images cannot be fully
patched (no Ubuntu Pro licence) and recommends them; the Ubuntu `pytorch-training` 2.10 image ends patching 2027-01-21.

`PATCH_WINDOW_TODAY=YYYY-MM-DD` makes the check answer as on that day (tests; "what will synth say in March?").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import date

from settings.fields import SettingsError

WARN_DAYS = 90
TODAY_ENV = "PATCH_WINDOW_TODAY"
_DLC = "aws/deep-learning-containers e0ecedea docs/src"
_LMI_RULE = ("no vendor end-of-patch date (aws/deep-learning-containers e0ecedea: docs/src/data/djl-inference/*.yml "
             "carry no eop); derived: GA + 1 year, the interval of the DLC data's PyTorch training rows, GA = ")


@dataclass(frozen=True)
class PatchWindow:
    image: str
    end_of_patch: date
    source: str


def _lmi(tag: str, ga: date, ga_source: str) -> PatchWindow:
    return PatchWindow(f"djl-inference:{tag}", ga.replace(year=ga.year + 1), _LMI_RULE + f"{ga} ({ga_source})")


def _training(version: str, platform: str, end: date, data: str = _DLC) -> PatchWindow:
    label = {"ec2": "EC2", "sagemaker": "SageMaker"}[platform]
    return PatchWindow(f"pytorch {version} Amazon Linux 2023 ({label})", end,
                       f"{data}/data/pytorch/{version}-cuda-{platform}.yml eop")


# Keys: what `deployed_images` names. Training tags are keyed by framework version and platform; the versions are
# settings.training's EC2_IMAGE_TAGS and SAGEMAKER_IMAGE_TAGS (a test checks both have rows). 2.14's data files came
# after e0ecedea: each row names the commit it was read at (ga 2026-09-28 in both).
WINDOWS: dict[str, PatchWindow] = {
    "pytorch:2.14-ec2": _training("2.14", "ec2", date(2027, 9, 28), "aws/deep-learning-containers dee632b1 docs/src"),
    "pytorch:2.14-sagemaker": _training("2.14", "sagemaker", date(2027, 9, 28),
                                        "aws/deep-learning-containers 1f8757ef docs/src"),
    **{f"pytorch:{version}-{platform}": _training(version, platform, end)
       for version, end in (("2.13", date(2027, 7, 20)), ("2.12", date(2027, 7, 2)), ("2.11", date(2027, 4, 30)))
       for platform in ("ec2", "sagemaker")},
    "python:3.13-slim-trixie": PatchWindow(
        "python:3.13-slim-trixie (the sentiment serving image's base)", date(2028, 8, 9),
        "Debian 13 regular security support: released 2025-08-09, about three years (wiki.debian.org/DebianReleases, "
        "estimate 2028-08-09; LTS to 2030-06-30); CPython 3.13 security fixes to 2029-10 (PEP 719): the earlier"),
    "djl-inference:0.23.0": _lmi("0.23.0-deepspeed0.9.5-cu118", date(2023, 7, 14),
                                 "djl-serving tag v0.23.0"),
    "djl-inference:0.33.0": _lmi("0.33.0-lmi15.0.0-cu128", date(2025, 5, 9),
                                 "djl-serving branch 0.33.0-dlc leaves master"),
    "djl-inference:0.35.0": _lmi("0.35.0-lmi17.0.0-cu128", date(2025, 11, 10),
                                 "djl-serving branch 0.35.0-dlc leaves master"),
    "djl-inference:0.36.0-lmi27": _lmi("0.36.0-lmi27.0.0-cu130", date(2026, 6, 22),
                                       "djl-serving branch 0.36.0-lmi27-dlc leaves master"),
    "djl-inference:0.36.0-lmi28": _lmi("0.36.0-lmi28.0.0-cu130", date(2026, 8, 11),
                                       "deep-learning-containers f68419c9 adds 0.36-lmi28.0.0-gpu.yml"),
    "djl-inference:0.38.0-lmi29": _lmi("0.38.0-lmi29.0.0-cu130", date(2026, 9, 1),
                                       "SageMaker SDK djl-lmi table, 2026-09; the first of the month"),
}


def today() -> date:
    given = os.environ.get(TODAY_ENV)
    if not given:
        return date.today()
    try:
        return date.fromisoformat(given)
    except ValueError:
        raise SettingsError(TODAY_ENV, given, "a date as YYYY-MM-DD") from None


def check(images: dict[str, str], *, allow_unpatched: bool, on: date | None = None) -> list[str]:
    """Warnings for images near their end of patch; SettingsError for one past it (unless allowed).

    `images` maps a `WINDOWS` key to the setting that chose it (`key=value`), which the refusal names.
    """
    on = on or today()
    warnings = []
    for key, chosen_by in images.items():
        window = WINDOWS.get(key)
        if window is None:
            setting, _, value = chosen_by.partition("=")
            raise SettingsError(setting, value, "an image with a known patch window (settings/patch_windows.py): "
                                                + ", ".join(WINDOWS))
        left = (window.end_of_patch - on).days
        if left < 0 and not allow_unpatched:
            setting, _, value = chosen_by.partition("=")
            raise SettingsError(setting, value, f"an image inside its patch window: {window.image} ended patching on "
                                                f"{window.end_of_patch} (source: {window.source}); set "
                                                f"allow_unpatched_images=true to deploy it anyway")
        if left < 0:
            warnings.append(f"{window.image} ended patching on {window.end_of_patch}, {-left} days ago; deployed "
                            f"because allow_unpatched_images=true (source: {window.source})")
        elif left <= WARN_DAYS:
            warnings.append(f"{window.image} ends patching on {window.end_of_patch}, in {left} days; move to a newer "
                            f"image before then (source: {window.source})")
    return warnings


def _training_key(tag: str, platform: str) -> str:
    """`2.13.0-cu133-amzn2023` -> `pytorch:2.13-ec2`; `2.13-cu133-amzn2023-sagemaker` -> `pytorch:2.13-sagemaker`."""
    version = ".".join(tag.split("-")[0].split(".")[:2])
    return f"pytorch:{version}-{platform}"


def deployed_images(settings) -> dict[str, str]:
    """The `WINDOWS` keys of what `settings` deploys, each with the setting that chose it (`key=value`)."""
    images = {}
    training = settings.training
    if training.enabled and training.backend == "ec2":
        images[_training_key(training.base_image_tag, "ec2")] = f"training.base_image_tag={training.base_image_tag}"
    if training.backend == "sagemaker":
        images[_training_key(training.sagemaker_image_tag, "sagemaker")] = (
            f"training.sagemaker_image_tag={training.sagemaker_image_tag}")
    if settings.sentiment.enabled:
        images["python:3.13-slim-trixie"] = "sentiment.enabled=true"
    if settings.falcon.enabled:
        images[f"djl-inference:{settings.falcon.lmi_version}"] = f"falcon.lmi_version={settings.falcon.lmi_version}"
    return images
