"""The JSON Schema of cdk.json's `context.environments` and `context.shared`, generated from the models.

    python -m settings.schema --write   # after changing a setting
    python -m settings.schema --check   # exit 1 when the checked-in file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from settings.model import Settings

SCHEMA_PATH = Path(__file__).resolve().parent / "cdk-context.schema.json"


def environment_schema() -> dict[str, Any]:
    """One environment block: every section and key optional (defaults fill the rest), unknown keys refused."""
    schema = TypeAdapter(Settings).json_schema()
    schema["properties"].pop("name")
    schema.pop("required", None)
    return schema


def cdk_json_schema() -> dict[str, Any]:
    environment = environment_schema()
    definitions = environment.pop("$defs", {})
    definitions["Environment"] = {**environment, "title": "Environment",
                                  "description": "Overrides of the settings' defaults for one environment"}
    reference = {"$ref": "#/$defs/Environment"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "cdk.json of this app",
        "description": "Generated from settings/ by `python -m settings.schema --write`; do not edit by hand.",
        "type": "object",
        "properties": {"context": {
            "type": "object",
            "properties": {
                "env": {"type": "string", "description": "the environment to synthesize (default dev)"},
                "environments": {"type": "object", "additionalProperties": reference,
                                 "description": "each environment's overrides of the defaults"},
                "shared": {**reference, "description": "values every environment starts from"},
            },
        }},
        "$defs": definitions,
    }


def render() -> str:
    return json.dumps(cdk_json_schema(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m settings.schema", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"write {SCHEMA_PATH.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the checked-in schema is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        SCHEMA_PATH.write_text(text)
        print(f"wrote {SCHEMA_PATH}")
        return 0
    if not SCHEMA_PATH.exists() or SCHEMA_PATH.read_text() != text:
        print(f"{SCHEMA_PATH} is stale: run python -m settings.schema --write", file=sys.stderr)
        return 1
    print(f"{SCHEMA_PATH.name} is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
