"""The one-line declaration other settings are ported to: each form README's "Adding a setting" shows works."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest
from pydantic import ValidationError

from settings import Settings, catalogue
from settings.fields import AwsRegion, describe_allowed, lax, section, setting, text


@section
class Example:
    max_queue: int = setting(256, "texts a worker holds waiting", ge=1, le=100000, unit="texts")
    precision: Literal["fp32", "bf16", "int8"] | None = setting(None, "overrides the archive's record")
    bucket: text(r"^[a-z0-9.-]{3,63}$", "a bucket name") | None = setting(None, "where results go")
    image_region: AwsRegion = setting("us-east-1", "where the image is pulled from")
    vllm_args: tuple[str, ...] = setting((), "name=value items, comma-separated")


FIELDS = catalogue(Example)


def from_cli(**given: str) -> Example:
    """As `-c key=value` strings arrive: through the same lax step as load_settings."""
    return Example(**{key: lax(FIELDS[key], value) if key in FIELDS else value for key, value in given.items()})


def test_declared_once_read_everywhere():
    assert FIELDS["max_queue"]["description"] == "texts a worker holds waiting"
    assert FIELDS["max_queue"]["unit"] == "texts"
    assert describe_allowed(FIELDS["max_queue"]) == "an integer from 1 to 100000"
    assert describe_allowed(FIELDS["precision"]) == "one of fp32, bf16, int8"
    assert describe_allowed(FIELDS["bucket"]) == "a bucket name"
    assert describe_allowed(FIELDS["image_region"]) == "an AWS region name such as us-west-2"


def test_strings_from_the_command_line_take_the_declared_type():
    example = from_cli(max_queue="64", precision="int8", bucket="none", vllm_args="a=1, b=2")
    assert (example.max_queue, example.precision, example.bucket) == (64, "int8", None)
    assert example.vllm_args == ("a=1", "b=2")
    assert from_cli(precision="null").precision is None


@pytest.mark.parametrize("given", [{"max_queue": "0"}, {"precision": "fp8"}, {"bucket": "Bad_Bucket"},
                                   {"image_region": "mars-1"}, {"unknown": "1"}])
def test_constraints_hold(given):
    with pytest.raises(ValidationError):
        from_cli(**given)


def test_frozen_and_replace_validates():
    example = Example()
    with pytest.raises(dataclasses.FrozenInstanceError):
        example.max_queue = 3  # type: ignore[misc]
    assert dataclasses.replace(example, max_queue=3).max_queue == 3
    with pytest.raises(ValidationError):
        dataclasses.replace(example, max_queue=0)


def test_every_real_setting_has_a_description():
    assert [key for key, entry in catalogue(Settings).items() if not entry.get("description")] == []
