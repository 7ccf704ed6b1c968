"""Where values come from (defaults, cdk.json, `-c`), which one wins, and one error line when one is wrong.

Layers, lowest first: the models' defaults, cdk.json `context.shared`, the environment's block in cdk.json
`context.environments`, `-c key=value`, `-c <env>/key=value`. pydantic validates the merged values once.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from settings.errors import SettingsError
from settings.fields import Allowed
from settings.model import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent
CDK_JSON = REPO_ROOT / "cdk.json"
DEFAULT_ENVIRONMENT = "dev"


@functools.cache
def catalogue(cls: type = Settings, prefix: str = "") -> dict[str, FieldInfo]:
    """Every dotted setting path and its declaration, in declaration order (the environment's name is no setting)."""
    fields: dict[str, FieldInfo] = {}
    for name, info in cls.__pydantic_fields__.items():
        if hasattr(info.annotation, "__pydantic_fields__"):
            fields.update(catalogue(info.annotation, f"{prefix}{name}."))
        elif prefix or name != "name":
            fields[prefix + name] = info
    return fields


def known_settings() -> list[str]:
    """Every dotted setting path, for help texts and error messages."""
    return sorted(catalogue())


def read_environments(path: Path = CDK_JSON) -> dict[str, dict[str, Any]]:
    """The environment declarations from cdk.json, the one place they live."""
    environments = json.loads(path.read_text())["context"]["environments"]
    return {name: dict(values or {}) for name, values in environments.items()}


def read_shared(path: Path = CDK_JSON) -> dict[str, Any]:
    """Settings every environment shares (cdk.json context `shared`), such as the pipeline's source."""
    return dict(json.loads(path.read_text())["context"].get("shared") or {})


def load_settings(env_name: str | None = None, overrides: Mapping[str, Any] | None = None,
                  environments: Mapping[str, Mapping[str, Any]] | None = None,
                  shared: Mapping[str, Any] | None = None) -> Settings:
    """Defaults, then shared values, then the environment's declaration, then overrides; validated as one."""
    return load_with_sources(env_name, overrides, environments, shared)[0]


def load_with_sources(env_name: str | None = None, overrides: Mapping[str, Any] | None = None,
                      environments: Mapping[str, Mapping[str, Any]] | None = None,
                      shared: Mapping[str, Any] | None = None) -> tuple[Settings, dict[str, str]]:
    """The settings and, for every dotted key, where its value came from (`default` when nothing set it)."""
    if environments is None:
        environments, shared = read_environments(), read_shared() if shared is None else shared
    env_name = env_name or DEFAULT_ENVIRONMENT
    if env_name not in environments:
        raise SettingsError("env", env_name, "one of " + ", ".join(environments))
    given = [(key, value, "cdk.json shared") for key, value in _flatten(shared or {})]
    given += [(key, value, f"cdk.json environments.{env_name}") for key, value in _flatten(environments[env_name])]
    scoped = []  # `-c <env>/key` wins over `-c key` whatever their order
    for key, value in _flatten(overrides or {}):
        scope, _, setting_key = key.rpartition("/")
        if scope and scope not in environments:
            raise SettingsError(key, value, "an environment prefix among " + ", ".join(environments))
        if scope == env_name:
            scoped.append((setting_key, value, f"-c {key}"))
        elif not scope:
            given.append((key, value, f"-c {key}"))
    known = catalogue()
    values, sources = {}, dict.fromkeys(known, "default")
    for key, value, source in given + scoped:
        _check_known(key, value)
        values[key], sources[key] = value, source
    try:
        settings = Settings(name=env_name, **_nest({key: lax(known[key], value) for key, value in values.items()}))
    except ValidationError as error:
        raise _one_line(error, values) from None
    return settings, sources


def settings_from_context(context: Mapping[str, Any]) -> Settings:
    """Settings from CDK context: `env` selects, every dotted or top-level key of ours overrides."""
    env_name = context.get("env")
    if env_name is not None and not isinstance(env_name, str):
        raise SettingsError("env", env_name, "an environment name")
    return load_settings(env_name, overrides_from_context(context))


def overrides_from_context(context: Mapping[str, Any]) -> dict[str, Any]:
    """Our keys among the CDK context: `section.key` for every environment, `<env>/section.key` for one."""
    # The CDK's own context keys carry '@' or ':' (feature flags, lookups, aws:cdk:*).
    return {key: value for key, value in context.items()
            if key not in ("env", "environments", "shared") and not key.startswith("@") and ":" not in key}


def _flatten(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in values.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, name = key.split(".")
        functools.reduce(lambda inner, part: inner.setdefault(part, {}), sections, nested)[name] = value
    return nested


def _check_known(key: str, value: Any) -> None:
    """An unknown key names the nearest known one and what its section (or the top level) holds."""
    known = known_settings()
    if key in known:
        return
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    section = key.rpartition(".")[0]
    siblings = [name.removeprefix(section + ".") for name in known if section and name.startswith(section + ".")]
    listing = (f"{section} has: {', '.join(siblings)}" if siblings else
               "sections and top-level settings: " + ", ".join(sorted({name.split('.')[0] for name in known})))
    raise SettingsError(key, value, f"a known setting{hint}; {listing}")


def value_type(info: FieldInfo) -> tuple[Any, bool, list[Any]]:
    """(the setting's type without None or Annotated, whether None is allowed, its constraints and markers)."""
    kind, optional, metadata = info.annotation, False, list(info.metadata)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind, optional = next(arg for arg in typing.get_args(kind) if arg is not type(None)), True
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


def _one_line(error: ValidationError, given: Mapping[str, Any]) -> SettingsError:
    """The first problem pydantic found, as our one line: dotted key, the value as given, what is allowed."""
    first = error.errors(include_url=False)[0]
    if isinstance(cause := (first.get("ctx") or {}).get("error"), SettingsError):
        return cause  # a cross-field rule already worded it
    parts, known = [str(part) for part in first["loc"]], catalogue()
    # A list's item or a union member adds to the location; the setting is its longest known prefix.
    key = next((key for n in range(len(parts), 0, -1) if (key := ".".join(parts[:n])) in known), ".".join(parts))
    if key not in known:
        return SettingsError(key, first.get("input"), first["msg"])
    return SettingsError(key, given.get(key, first.get("input")), describe_allowed(known[key], first["type"]))
