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
from collections.abc import Mapping
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
DEFAULT_SOURCE = "default"

# Context keys that belong to the CDK itself or to the environment selector, not to our settings.
_RESERVED_CONTEXT_KEYS = {"env", "environments", "shared"}
_RANGE_ERRORS = {"greater_than_equal", "less_than_equal", "greater_than", "less_than"}


def is_section(kind: Any) -> bool:
    return isinstance(kind, type) and hasattr(kind, "__pydantic_fields__")


@functools.cache
def catalogue(cls: type = Settings, prefix: str = "") -> dict[str, FieldInfo]:
    """Every dotted setting path and its declaration, in declaration order."""
    fields: dict[str, FieldInfo] = {}
    for name, info in cls.__pydantic_fields__.items():
        if cls is Settings and name == "name":
            continue
        if is_section(info.annotation):
            fields.update(catalogue(info.annotation, f"{prefix}{name}."))
        else:
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
    layers = [(shared or {}, lambda key: "cdk.json shared"),
              (environments[env_name], lambda key: f"cdk.json environments.{env_name}")]
    common, scoped = _split_overrides(overrides or {}, env_name, environments)
    layers += [(common, lambda key: f"-c {key}"), (scoped, lambda key: f"-c {env_name}/{key}")]
    values: dict[str, Any] = {}
    given: dict[str, Any] = {}
    sources = dict.fromkeys(catalogue(), DEFAULT_SOURCE)
    for layer, label in layers:
        for key, value in _flatten(layer).items():
            _check_known(key, value)
            given[key], values[key], sources[key] = value, _lax(key, value), label(key)
    try:
        settings = Settings(name=env_name, **_nest(values))
    except ValidationError as error:
        raise _one_line(error, given) from None
    return settings, sources


def settings_from_context(context: Mapping[str, Any]) -> Settings:
    """Settings from CDK context: `env` selects, every dotted or top-level key of ours overrides."""
    return load_settings(_env_from_context(context), overrides_from_context(context))


def _env_from_context(context: Mapping[str, Any]) -> str | None:
    env_name = context.get("env")
    if env_name is not None and not isinstance(env_name, str):
        raise SettingsError("env", env_name, "an environment name")
    return env_name


def overrides_from_context(context: Mapping[str, Any]) -> dict[str, Any]:
    """Our keys among the CDK context: `section.key` for every environment, `<env>/section.key` for one."""
    return {key: value for key, value in context.items() if _is_ours(key)}


def _is_ours(key: str) -> bool:
    # The CDK's own context keys carry '@' or ':' (feature flags, lookups, aws:cdk:*).
    return key not in _RESERVED_CONTEXT_KEYS and not key.startswith("@") and ":" not in key


def _split_overrides(overrides: Mapping[str, Any], env_name: str,
                     environments: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(overrides for every environment, overrides scoped to `env_name` with `<env>/`); scoped ones win."""
    common, scoped = {}, {}
    for key, value in overrides.items():
        if "/" not in key:
            common[key] = value
            continue
        prefix, setting_key = key.split("/", 1)
        if prefix not in environments:
            raise SettingsError(key, value, "an environment prefix among " + ", ".join(environments))
        if prefix == env_name:
            scoped[setting_key] = value
    return common, scoped


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, name = key.split(".")
        target = nested
        for part in sections:
            target = target.setdefault(part, {})
        target[name] = value
    return nested


def _check_known(key: str, value: Any) -> None:
    known = known_settings()
    if key in known:
        return
    section = key.rsplit(".", 1)[0] + "." if "." in key else ""
    siblings = [k.removeprefix(section) for k in known if section and k.startswith(section)]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    if siblings:
        allowed = f"a known setting{hint}; {section.rstrip('.')} has: {', '.join(siblings)}"
    else:
        sections = sorted({k.split('.')[0] for k in known})
        allowed = f"a known setting{hint}; sections and top-level settings: {', '.join(sections)}"
    raise SettingsError(key, value, allowed)


def value_type(info: FieldInfo) -> tuple[Any, bool, list[Any]]:
    """(the setting's type without None or Annotated, whether None is allowed, its constraints and markers)."""
    kind, optional, metadata = info.annotation, False, list(info.metadata)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind, optional = next(a for a in typing.get_args(kind) if a is not type(None)), True
    if typing.get_origin(kind) is Annotated:
        kind, metadata = kind.__origin__, metadata + list(kind.__metadata__)
    return kind, optional, metadata


def _lax(key: str, value: Any) -> Any:
    """What a `-c` string means for this setting's type; pydantic's lax mode does the rest (bools, numbers)."""
    if not isinstance(value, str):
        return value
    kind, optional, _ = value_type(catalogue()[key])
    text = value.strip()
    if optional and text.lower() in ("", "none", "null"):
        return None
    if typing.get_origin(kind) is tuple:
        return tuple(item.strip() for item in text.split(",") if item.strip())
    if typing.get_origin(kind) is Literal and all(isinstance(a, int) for a in typing.get_args(kind)):
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else value
    return value


def describe_allowed(info: FieldInfo, error_type: str = "") -> str:
    """What a setting accepts, in words: choices, the declared phrase, or its type and range."""
    kind, _, metadata = value_type(info)
    if typing.get_origin(kind) is Literal:
        return "one of " + ", ".join(str(choice) for choice in typing.get_args(kind))
    words = next((m.words for m in metadata if isinstance(m, Allowed)), None)
    if words:
        return words
    word = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        kind, "a comma-separated list")
    bounds = {type(m).__name__: m for m in metadata}
    if "Ge" in bounds and "Le" in bounds:
        low, high = bounds["Ge"].ge, bounds["Le"].le
        return f"{'a value' if error_type in _RANGE_ERRORS else word} from {low:g} to {high:g}"
    return word


def _one_line(error: ValidationError, given: Mapping[str, Any]) -> SettingsError:
    """The first problem pydantic found, as our one line: dotted key, the value as given, what is allowed."""
    first = error.errors(include_url=False)[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, SettingsError):
        return cause
    parts = [str(part) for part in first["loc"]]
    known = catalogue()
    key = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in known),
               ".".join(parts))
    if key not in known:
        return SettingsError(key, first.get("input"), first["msg"])
    return SettingsError(key, given.get(key, first.get("input")), describe_allowed(known[key], first["type"]))
