"""How a setting is declared: `name: type = setting(default, "what it means", ge=..., le=..., unit=...)`.

Choices are `Literal[...]`, optional settings `X | None`, comma lists `tuple[str, ...]`, and strings with a
shape `text(pattern, allowed)` or one of the named shapes below.

Constraints, meaning and unit sit beside the default, once; validation, error wording, `make settings` and the
JSON Schema for cdk.json all read them from here (value_type, lax, describe_allowed read a declaration back).
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo


class SettingsError(ValueError):
    """A setting is wrong; the message is one line a user can act on: the key, the value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        plain = isinstance(value, (bool, int, float, list, tuple, dict, type(None)))  # JSON-like: shown as JSON
        shown = json.dumps(value) if plain else repr(value)
        super().__init__(f"invalid setting {key}={shown}: expected {allowed}")


# CloudWatch Logs accepts only these retention periods.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                      2557, 2922, 3288, 3653)


@dataclasses.dataclass(frozen=True)
class Allowed:
    """How errors and `make settings` word what a pattern accepts (a regex is no answer for a user)."""

    words: str


def text(pattern: str, allowed: str) -> Any:
    """A string setting that must match `pattern`, described to users as `allowed`."""
    return Annotated[str, StringConstraints(pattern=pattern), Allowed(allowed)]


AwsRegion = text(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$", "an AWS region name such as us-west-2")
AwsAccount = text(r"^\d{12}$", "a 12-digit AWS account id")
Ec2InstanceType = text(r"^[a-z][a-z0-9-]*\.[0-9]*[a-z0-9]+$", "an EC2 instance type such as p4d.24xlarge")
SageMakerInstanceType = text(r"^ml\.[a-z][a-z0-9-]*\.[0-9]*[a-z0-9]+$",
                             "a SageMaker instance type such as ml.c7g.4xlarge")
ImageTag = text(r"^[A-Za-z0-9._-]+$", "an image tag: letters, digits, '.', '_' and '-'")
LogRetentionDays = Literal[LOG_RETENTION_DAYS]

# Lax coercion for strings from `-c key=value`, strict shape for everything else; unknown keys are errors.
CONFIG = ConfigDict(extra="forbid", str_strip_whitespace=True, validate_default=False)


def section(cls: type) -> type:
    """A frozen, validated settings section (a pydantic dataclass, so `dataclasses.replace` still validates)."""
    return dataclass(frozen=True, config=CONFIG)(cls)


def setting(default: Any, description: str, *, unit: str | None = None, ge: float | None = None,
            le: float | None = None) -> Any:
    """One setting's default, meaning, range and unit, declared together; a section class is its own default."""
    if isinstance(default, type):
        return Field(default_factory=default, description=description)
    return Field(default, description=description, ge=ge, le=le, json_schema_extra={"unit": unit} if unit else None)


def value_type(info: FieldInfo) -> tuple[Any, bool, list[Any]]:
    """(the setting's type without None or Annotated, whether None is allowed, its constraints and markers)."""
    kind, metadata = info.annotation, list(info.metadata)
    if optional := typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
    if typing.get_origin(kind) is Annotated:
        kind, metadata = kind.__origin__, metadata + list(kind.__metadata__)
    return kind, optional, metadata


def lax(info: FieldInfo, value: Any) -> Any:
    """What a `-c` string means for this setting's type; pydantic's lax mode does the rest (bools, numbers)."""
    kind, optional, _ = value_type(info)
    if not isinstance(value, str):
        return value
    if optional and value.strip().lower() in ("", "none", "null"):
        return None
    if typing.get_origin(kind) is tuple:
        return tuple(item.strip() for item in value.split(",") if item.strip())
    if typing.get_origin(kind) is Literal and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value) if int(value) in typing.get_args(kind) else value
    return value


def describe_allowed(info: FieldInfo, error_type: str = "") -> str:
    """What a setting accepts, in words: choices, the declared phrase, or its type and range."""
    kind, _, metadata = value_type(info)
    if typing.get_origin(kind) is Literal:
        return "one of " + ", ".join(str(choice) for choice in typing.get_args(kind))
    if words := next((marker.words for marker in metadata if isinstance(marker, Allowed)), None):
        return words
    word = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        kind, "a comma-separated list")
    bounds = {type(marker).__name__: marker for marker in metadata}
    if "Ge" not in bounds or "Le" not in bounds:
        return word
    out_of_range = error_type in ("greater_than_equal", "less_than_equal")
    return f"{'a value' if out_of_range else word} from {bounds['Ge'].ge:g} to {bounds['Le'].le:g}"
