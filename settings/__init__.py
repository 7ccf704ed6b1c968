"""One typed, frozen settings object per environment, validated once at app start (pydantic v2).

Defaults, constraints and descriptions live on the section models (settings/network.py, training.py, serving.py,
operations.py, the whole in model.py). Values come in layers, lowest first: those defaults, cdk.json
`context.shared`, the environment's block in cdk.json `context.environments`, `-c key=value`, `-c <env>/key=value`.
pydantic validates the merged values once; every error is one line naming the dotted key, the value given and what
is allowed. `python -m settings` shows each value and where it came from. Nothing here imports the CDK: stacks,
training and inference tools all build on it.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from settings.fields import SettingsError, describe_allowed, lax
from settings.model import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent
CDK_JSON = REPO_ROOT / "cdk.json"
DEFAULT_ENVIRONMENT = "dev"
Layer = Mapping[str, Any]


@functools.cache
def catalogue(cls: type = Settings) -> dict[str, dict[str, Any]]:
    """Every dotted setting and the JSON Schema pydantic makes of its declaration, in declaration order."""
    schema = TypeAdapter(cls).json_schema()

    def walk(properties: Layer, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for name, entry in properties.items():
            if "$ref" in entry:  # a section
                yield from walk(schema["$defs"][entry["$ref"].rpartition("/")[2]]["properties"], f"{prefix}{name}.")
            elif prefix or name != "name":  # the environment's name is no setting
                yield prefix + name, entry
    return dict(walk(schema["properties"], ""))


def known_settings() -> list[str]:
    """Every dotted setting path, for help texts and error messages."""
    return sorted(catalogue())


def read_context(path: Path = CDK_JSON) -> tuple[dict[str, Layer], Layer]:
    """cdk.json's environment declarations (the one place they live) and the values every environment shares."""
    context = json.loads(path.read_text())["context"]
    return context["environments"], context.get("shared") or {}


def load_settings(env_name: str | None = None, overrides: Layer | None = None,
                  environments: Mapping[str, Layer] | None = None, shared: Layer | None = None) -> Settings:
    """Defaults, then shared values, then the environment's declaration, then overrides; validated as one."""
    return load_with_sources(env_name, overrides, environments, shared)[0]


def load_with_sources(env_name: str | None = None, overrides: Layer | None = None,
                      environments: Mapping[str, Layer] | None = None,
                      shared: Layer | None = None) -> tuple[Settings, dict[str, str]]:
    """The settings and, for every dotted key, where its value came from (`default` when nothing set it)."""
    if environments is None:
        environments, in_cdk_json = read_context()
        shared = in_cdk_json if shared is None else shared
    env_name = env_name or DEFAULT_ENVIRONMENT
    if not isinstance(env_name, str) or env_name not in environments:
        raise SettingsError("env", env_name, "one of " + ", ".join(environments))
    given = [(key, value, "cdk.json shared") for key, value in _flatten(shared)]
    given += [(key, value, f"cdk.json environments.{env_name}") for key, value in _flatten(environments[env_name])]
    # `-c <env>/key` wins over `-c key` whatever their order, so the scoped ones go last.
    for key, value in sorted(_flatten(overrides or {}), key=lambda item: "/" in item[0]):
        scope, _, setting_key = key.rpartition("/")
        if scope and scope not in environments:
            raise SettingsError(key, value, "an environment prefix among " + ", ".join(environments))
        if scope in ("", env_name):
            given.append((setting_key, value, f"-c {key}"))
    known = catalogue()
    values, sources, nested = {}, dict.fromkeys(known, "default"), {}
    for key, value, source in given:
        if key not in known:
            raise _unknown(key, value)
        values[key], sources[key] = value, source
        *sections, name = key.split(".")
        section = functools.reduce(lambda inner, part: inner.setdefault(part, {}), sections, nested)
        section[name] = lax(known[key], value)
    try:
        settings = Settings(name=env_name, **nested)
    except ValidationError as error:
        raise _one_line(error, values) from None
    return settings, sources


def settings_from_context(context: Layer) -> Settings:
    """Settings from CDK context: `env` selects, every dotted or top-level key of ours overrides."""
    return load_settings(context.get("env"), overrides_from_context(context))


def overrides_from_context(context: Layer) -> dict[str, Any]:
    """Our keys among the CDK context: `section.key` for every environment, `<env>/section.key` for one."""
    # The CDK's own context keys carry '@' or ':' (feature flags, lookups, aws:cdk:*).
    return {key: value for key, value in context.items()
            if key not in ("env", "environments", "shared") and not key.startswith("@") and ":" not in key}


def _flatten(values: Layer | None, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in (values or {}).items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


# Settings that existed and were removed: what a cdk.json or `-c` that still sets one must do instead. Any value
# fails at app start, so a retired choice is never silently ignored.
RETIRED: dict[str, str] = {
    "sentiment.runtime": "it removed (retired in issue 43): our serving image is the only sentiment runtime since the "
                         "TorchServe image of sentiment.runtime=dlc (pytorch-inference-arm64:2.6) ended patching on "
                         "2026-06-30; an environment deployed with it upgrades in place (docs/updating.md)",
    "sentiment.quantize": "it removed (retired with sentiment.runtime=dlc, issue 43): our server's int8 is "
                          "sentiment.precision=int8, or the accuracy gate's choice recorded in the model archive",
    "sentiment.pytorch_version": "it removed (retired with sentiment.runtime=dlc, issue 43): the serving image's "
                                 "torch is pinned in inference/sentiment/image/torch.lock",
}


def _unknown(key: str, value: Any) -> SettingsError:
    """A retired key says what replaces it; any other unknown key names the nearest known one and what its section
    (or the top level) holds."""
    if key in RETIRED:
        return SettingsError(key, value, RETIRED[key])
    known = known_settings()
    close = difflib.get_close_matches(key, known, n=1)
    section = key.rpartition(".")[0]
    siblings = [name.removeprefix(section + ".") for name in known if section and name.startswith(section + ".")]
    listing = (f"{section} has: {', '.join(siblings)}" if siblings else
               "sections and top-level settings: " + ", ".join(sorted({name.split('.')[0] for name in known})))
    return SettingsError(key, value, f"a known setting{f' (did you mean {close[0]}?)' if close else ''}; {listing}")


def _one_line(error: ValidationError, given: Layer) -> SettingsError:
    """The first problem pydantic found, as our one line: dotted key, the value as given, what is allowed."""
    first = error.errors(include_url=False)[0]
    if isinstance(cause := (first.get("ctx") or {}).get("error"), SettingsError):
        return cause  # a cross-field rule already worded it
    known = catalogue()
    key = ".".join(part for part in first["loc"] if isinstance(part, str))  # a list item's index is no setting
    if key not in known:
        return SettingsError(key, first.get("input"), first["msg"])
    return SettingsError(key, given.get(key, first.get("input")), describe_allowed(known[key], first["type"]))
