"""How a setting is declared: `name: type = setting(default, "what it means", ge=..., le=..., unit=...)`.

Choices are `Literal[...]`, optional settings `X | None`, comma lists `tuple[str, ...]`, and strings with a
shape `text(pattern, allowed)` or one of the named shapes below.

Constraints, meaning and unit sit beside the default, once; validation, error wording, `make settings` and the
JSON Schema for cdk.json all read them from here.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints
from pydantic.dataclasses import dataclass

# CloudWatch Logs accepts only these retention periods.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                      2557, 2922, 3288, 3653)

INSTANCE_TYPE_EC2 = r"^[a-z][a-z0-9-]*\.[0-9]*[a-z0-9]+$"
INSTANCE_TYPE_SAGEMAKER = r"^ml\.[a-z][a-z0-9-]*\.[0-9]*[a-z0-9]+$"
REGION = r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$"


@dataclasses.dataclass(frozen=True)
class Allowed:
    """How errors and `make settings` word what a pattern accepts (a regex is no answer for a user)."""

    words: str


def text(pattern: str, allowed: str) -> Any:
    """A string setting that must match `pattern`, described to users as `allowed`."""
    return Annotated[str, StringConstraints(pattern=pattern), Allowed(allowed)]


AwsRegion = text(REGION, "an AWS region name such as us-west-2")
AwsAccount = text(r"^\d{12}$", "a 12-digit AWS account id")
Ec2InstanceType = text(INSTANCE_TYPE_EC2, "an EC2 instance type such as p4d.24xlarge")
SageMakerInstanceType = text(INSTANCE_TYPE_SAGEMAKER, "a SageMaker instance type such as ml.c7g.4xlarge")
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
