"""How a setting is declared: `name: type = setting(default, "what it means", ge=..., le=..., unit=...)`.

Choices are `Literal[...]`, optional settings `X | None`, comma lists `tuple[str, ...]`, and strings with a
shape `text(pattern, allowed)` or one of the named shapes below. Validation, errors, `make settings` and cdk.json's
JSON Schema all read the one JSON Schema pydantic makes of these declarations (`lax` and `describe_allowed` here).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints
from pydantic.dataclasses import dataclass


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
    """What a pattern accepts, in words (a regex is no answer for a user). The JSON Schema carries them as
    `patternErrorMessage`, which VS Code shows instead of the regex (microsoft/vscode 020f7c6d
    src/vs/base/common/jsonSchema.ts; vscode-json-languageservice src/parser/jsonParser.ts)."""

    words: str

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        return {**handler(core_schema), "patternErrorMessage": self.words}


def text(pattern: str, allowed: str) -> Any:
    """A string setting that must match `pattern`, described to users as `allowed`."""
    return Annotated[str, StringConstraints(pattern=pattern), Allowed(allowed)]


# S3's rules for bucket names that the URI patterns below check (docs.aws.amazon.com/AmazonS3/latest/userguide/
# bucketnamingrules.html); S3 has more (no '..', no IP address form), which S3 itself enforces.
S3_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
_BUCKET_CHARACTERS = set("abcdefghijklmnopqrstuvwxyz0123456789.-")


def s3_uri_problem(value: str, key_ending: str) -> str | None:
    """What keeps `value` from being `s3://<bucket>/<key>` with a key ending in `key_ending` (after at least one
    character), in words; None when nothing does. The same rules as `s3_uri_pattern` (a test holds them together)."""
    if not value.startswith("s3://"):
        return "it does not start with s3://"
    bucket, _, key = value.removeprefix("s3://").partition("/")
    if not 3 <= len(bucket) <= 63:
        return (f"its bucket name {bucket!r} is {len(bucket)} character{'' if len(bucket) == 1 else 's'} long; S3 "
                "bucket names are 3 to 63 characters")
    if wrong := sorted(set(bucket) - _BUCKET_CHARACTERS):
        return (f"its bucket name {bucket!r} holds {', '.join(map(repr, wrong))}; S3 bucket names hold only "
                "lowercase letters, digits, '.' and '-'")
    if not (bucket[0].isalnum() and bucket[-1].isalnum()):
        return f"its bucket name {bucket!r} must begin and end with a lowercase letter or a digit"
    if not key:
        return "it names no object key after the bucket"
    if len(key) <= len(key_ending) or not key.endswith(key_ending) or "\n" in key:
        return f"its object key {key!r} does not end in {key_ending}"
    return None


def s3_uri_pattern(key_ending: str) -> str:
    return rf"^s3://{S3_BUCKET}/.+{re.escape(key_ending)}$"


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


def accepts(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(what a setting's JSON Schema accepts besides null, whether it accepts null)."""
    options = schema.get("anyOf", [schema])
    return next(option for option in options if option.get("type") != "null"), len(options) > 1


def lax(schema: dict[str, Any], value: Any) -> Any:
    """What a `-c` string means for this setting; pydantic's lax mode does the rest (bools, numbers)."""
    if not isinstance(value, str):
        return value
    accepted, optional = accepts(schema)
    if optional and value.strip().lower() in ("", "none", "null"):
        return None
    if accepted["type"] == "array":
        return tuple(item.strip() for item in value.split(",") if item.strip())
    if accepted["type"] == "integer" and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)  # pydantic reads "4" as 4 for an int, but not for a choice among ints
    return value


TYPE_WORDS = {"boolean": "true or false", "integer": "an integer", "number": "a number", "string": "a string",
              "array": "a comma-separated list"}


def describe_allowed(schema: dict[str, Any], error_type: str = "") -> str:
    """What a setting accepts, in words: choices, the declared phrase, or its type and range."""
    accepted, _ = accepts(schema)
    if "enum" in accepted:
        return "one of " + ", ".join(str(choice) for choice in accepted["enum"])
    if "patternErrorMessage" in accepted:
        return accepted["patternErrorMessage"]
    if "minimum" not in accepted or "maximum" not in accepted:
        return TYPE_WORDS[accepted["type"]]
    word = "a value" if error_type in ("greater_than_equal", "less_than_equal") else TYPE_WORDS[accepted["type"]]
    return f"{word} from {accepted['minimum']:g} to {accepted['maximum']:g}"
