"""cdk.json's JSON Schema: generated from the settings models, checked in, current, and it catches typos."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from settings import CDK_JSON
from settings.schema import SCHEMA_PATH, main, render


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_checked_in_schema_is_current():
    assert SCHEMA_PATH.read_text() == render(), "run: python -m settings.schema --write (make settings-schema)"
    assert main(["--check"]) == 0


def test_stale_schema_is_reported(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "cdk-context.schema.json"
    stale.write_text("{}\n")
    monkeypatch.setattr("settings.schema.SCHEMA_PATH", stale)
    assert main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err


def test_cdk_json_is_valid(validator):
    errors = [error.message for error in validator.iter_errors(json.loads(CDK_JSON.read_text()))]
    assert errors == []


@pytest.mark.parametrize(("path", "key", "value", "fragment"), [
    (("environments", "prod", "sentiment"), "min_instance", 2, "'min_instance' was unexpected"),
    (("environments", "prod"), "falcn", {"enabled": True}, "'falcn' was unexpected"),
    (("shared", "pipeline"), "branchh", "main", "'branchh' was unexpected"),
    (("environments", "prod", "network"), "nat_gateways", 5, "5 is greater than the maximum of 2"),
    (("environments", "dev", "falcon"), "batching", "static", "'static' is not one of"),
    (("environments", "dev", "training"), "enabled", "yes", "'yes' is not of type 'boolean'"),
])
def test_schema_rejects_a_typo_or_bad_value_in_cdk_json(validator, path, key, value, fragment):
    document = copy.deepcopy(json.loads(CDK_JSON.read_text()))
    target = document["context"]
    for part in path:
        target = target.setdefault(part, {})
    target[key] = value
    messages = [error.message for error in validator.iter_errors(document)]
    assert any(fragment in message for message in messages), messages


def test_a_pattern_carries_its_words_for_editors():
    """VS Code shows `patternErrorMessage` instead of the regex for a value that does not match
    (microsoft/vscode-json-languageservice src/parser/jsonParser.ts: patternErrorMessage || errorMessage || ...)."""
    definitions = json.loads(render())["$defs"]
    region = definitions["Environment"]["properties"]["region"]
    assert region["patternErrorMessage"] == "an AWS region name such as us-west-2" and region["pattern"]
    optional_secret = definitions["FalconSettings"]["properties"]["hf_token_secret"]["anyOf"][0]
    assert optional_secret["patternErrorMessage"] == "a Secrets Manager secret name or ARN"
