"""How a setting is declared: `name: type = setting(default, description=..., ge=..., le=..., unit=...)`.

Constraints, meaning and unit sit beside the default, once; validation, error wording, `make settings` and the
JSON Schema for cdk.json all read them from here.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass

# CloudWatch Logs accepts only these retention periods.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                      2557, 2922, 3288, 3653)

INSTANCE_TYPE_EC2 = r"^[a-z][a-z0-9-]*\.[0-9]*[a-z0-9]+$"
INSTANCE_TYPE_SAGEMAKER = r"^ml\.[a-z][a-z0-9-]*\.[0-9]*[a-z0-9]+$"
REGION = r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$"
ACCOUNT = r"^\d{12}$"

# Lax coercion for strings from `-c key=value`, strict shape for everything else; unknown keys are errors.
CONFIG = ConfigDict(extra="forbid", str_strip_whitespace=True, validate_default=False)


def section(cls: type) -> type:
    """A frozen, validated settings section (a pydantic dataclass, so `dataclasses.replace` still validates)."""
    return dataclass(frozen=True, config=CONFIG)(cls)


def setting(default: Any = None, *, description: str, unit: str | None = None, allowed: str | None = None,
            ge: float | None = None, le: float | None = None, pattern: str | None = None,
            default_factory: Any = None) -> Any:
    """One setting's default, constraints and meaning; `allowed` words a pattern for error messages."""
    extra = {key: value for key, value in (("unit", unit), ("allowed", allowed)) if value is not None}
    if default_factory is not None:
        return Field(default_factory=default_factory, description=description, json_schema_extra=extra or None)
    return Field(default, description=description, ge=ge, le=le, pattern=pattern, json_schema_extra=extra or None)
