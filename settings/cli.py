"""Show every setting of an environment: effective value, where it came from, type, allowed values, meaning.

    python -m settings --env prod -c falcon.enabled=true -c prod/falcon.max_rolling_batch_size=64
    python -m settings --env prod --json
    python -m settings --diff dev prod
    make settings ENV=prod CDK_ARGS="-c falcon.enabled=true"

`-c key=value` takes the same overrides as `cdk synth` (CDK_ARGS), validated the same way; `-c env=NAME` selects
the environment as `--env` does. Exit status 1 on a bad setting, with the one-line error.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import Any

from settings import DEFAULT_ENVIRONMENT, catalogue, load_with_sources
from settings.fields import SettingsError, accepts, describe_allowed


def _context_pair(text: str) -> tuple[str, str]:
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m settings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", help=f"environment from cdk.json (default {DEFAULT_ENVIRONMENT})")
    parser.add_argument("-c", "--context", dest="context", action="append", type=_context_pair, default=[],
                        metavar="KEY=VALUE", help="an override as for cdk synth; repeatable")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--diff", nargs=2, metavar=("ENV_A", "ENV_B"), help="only the settings that differ")
    return parser


def show_value(value: Any) -> str:
    """A value as one would write it after `-c key=`."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        value = ",".join(value)
    return str(value) if value != "" else '""'


TYPE_NAMES = {"boolean": "bool", "integer": "int", "number": "float", "string": "str", "array": "list[str]"}


def type_name(schema: dict[str, Any]) -> str:
    accepted, optional = accepts(schema)
    name = "choice" if "enum" in accepted else TYPE_NAMES[accepted["type"]]
    return f"{name} | none" if optional else name


def describe(env_name: str | None, overrides: dict[str, str]) -> list[dict[str, Any]]:
    """One row per setting, in declaration order."""
    settings, sources = load_with_sources(env_name, overrides)
    rows = []
    for key, schema in catalogue().items():
        rows.append({"key": key, "value": functools.reduce(getattr, key.split("."), settings), "source": sources[key],
                     "type": type_name(schema), "allowed": describe_allowed(schema), "unit": schema.get("unit"),
                     "description": schema.get("description", ""), "environment": settings.name})
    return rows


def _print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"# environment {rows[0]['environment']}" if rows else "# no settings")
    for row in rows:
        source = "default" if row["source"] == "default" else f"from {row['source']}"
        unit = f" {row['unit']}" if row["unit"] else ""
        print(f"{row['key']} = {show_value(row['value'])}{unit} ({source})")
        print(f"    {row['type']}: {row['allowed']}. {row['description']}")


def _diff(env_a: str, env_b: str, overrides: dict[str, str], as_json: bool) -> None:
    rows_a, rows_b = describe(env_a, overrides), describe(env_b, overrides)
    changed = [(a, b) for a, b in zip(rows_a, rows_b, strict=True) if a["value"] != b["value"]]
    if as_json:
        print(json.dumps([{"key": a["key"], env_a: {"value": a["value"], "source": a["source"]},
                           env_b: {"value": b["value"], "source": b["source"]}} for a, b in changed], indent=2))
        return
    width = max((len(a["key"]) for a, _ in changed), default=0)
    for a, b in changed:
        print(f"{a['key']:<{width}}  {env_a}: {show_value(a['value'])} ({a['source']})  "
              f"{env_b}: {show_value(b['value'])} ({b['source']})")
    if not changed:
        print(f"{env_a} and {env_b} have the same settings")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides = dict(args.context)
    env_name = overrides.pop("env", None) or args.env
    try:
        if args.diff:
            _diff(*args.diff, overrides, args.json)
        elif args.json:
            print(json.dumps(describe(env_name, overrides), indent=2))
        else:
            _print_rows(describe(env_name, overrides))
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `make settings | head` stopped reading: no traceback (Python docs, signal, SIGPIPE)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0
