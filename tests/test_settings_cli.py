"""`python -m settings` (make settings): each value with its source, type, allowed values and meaning."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from settings import REPO_ROOT, known_settings, load_with_sources
from settings.cli import main

ISSUE_ARGS = ["--env", "prod", "-c", "falcon.enabled=true", "-c", "prod/falcon.max_rolling_batch_size=64"]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_issue_example_shows_each_kind_of_source(capsys):
    code, out, _ = run(capsys, *ISSUE_ARGS)
    assert code == 0
    lines = out.splitlines()
    assert "falcon.max_rolling_batch_size = 64 (from -c prod/falcon.max_rolling_batch_size)" in lines
    assert "falcon.enabled = true (from -c falcon.enabled)" in lines
    assert "sentiment.min_instances = 2 (from cdk.json environments.prod)" in lines
    assert "pipeline.branch = main (from cdk.json shared)" in lines
    assert "falcon.batch_size = 4 (default)" in lines
    # Every setting is shown, each followed by its type, allowed values and description.
    for key in known_settings():
        assert any(line.startswith(f"{key} = ") for line in lines), key
    index = lines.index("falcon.max_rolling_batch_size = 64 (from -c prod/falcon.max_rolling_batch_size)")
    assert lines[index + 1].strip() == "int: an integer from 1 to 1024. continuous batching: sequences at once"


def test_issue_example_shows_every_setting_not_set_elsewhere_as_its_default(capsys):
    """Exactly the keys cdk.json (prod, shared) and -c set carry a source; every other one says default."""
    def dotted(block: dict, prefix: str = "") -> set[str]:
        return set().union(*(dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
                             for k, v in block.items()))

    context = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    expected = {key: "cdk.json environments.prod" for key in dotted(context["environments"]["prod"])}
    expected |= {key: "cdk.json shared" for key in dotted(context["shared"])}
    expected |= {"falcon.enabled": "-c falcon.enabled",
                 "falcon.max_rolling_batch_size": "-c prod/falcon.max_rolling_batch_size"}
    _, out, _ = run(capsys, *ISSUE_ARGS)
    shown = dict(re.fullmatch(r"(\S+) = .* \((?:from )?(.+)\)", line).groups()
                 for line in out.splitlines() if not line.startswith(("#", " ")))
    assert {key: source for key, source in shown.items() if source != "default"} == expected
    assert set(shown) == set(known_settings())


def test_sources_for_every_layer():
    _, sources = load_with_sources("prod", {"falcon.enabled": "true", "prod/falcon.batch_size": "8",
                                            "dev/falcon.batch_size": "2"})
    assert sources["falcon.enabled"] == "-c falcon.enabled"
    assert sources["falcon.batch_size"] == "-c prod/falcon.batch_size"
    assert sources["network.nat_gateways"] == "cdk.json environments.prod"
    assert sources["pipeline.repository"] == "cdk.json shared"
    assert sources["region"] == "default"


def test_json_output_is_machine_readable(capsys):
    code, out, _ = run(capsys, *ISSUE_ARGS, "--json")
    rows = {row["key"]: row for row in json.loads(out)}
    assert code == 0 and set(rows) == set(known_settings())
    assert rows["falcon.max_rolling_batch_size"] == {
        "key": "falcon.max_rolling_batch_size", "value": 64, "source": "-c prod/falcon.max_rolling_batch_size",
        "type": "int", "allowed": "an integer from 1 to 1024", "unit": None,
        "description": "continuous batching: sequences at once", "environment": "prod"}
    assert rows["falcon.tensor_parallel_degree"]["allowed"] == "one of 1, 2, 4, 8"
    assert rows["training.max_train_samples"]["type"] == "int | none"


def test_diff_shows_only_what_differs(capsys):
    code, out, _ = run(capsys, "--diff", "dev", "prod")
    assert code == 0
    keys = [line.split()[0] for line in out.splitlines()]
    assert "sentiment.min_instances" in keys and "network.nat_gateways" in keys
    assert "falcon.batching" not in keys
    code, out, _ = run(capsys, "--diff", "dev", "prod", "--json")
    assert {"key": "sentiment.min_instances", "dev": {"value": 1, "source": "default"},
            "prod": {"value": 2, "source": "cdk.json environments.prod"}} in json.loads(out)


@pytest.mark.parametrize(("override", "expected"), [
    # unknown key: the nearest valid name, and the section's keys
    ("falcon.max_rolling_batch_sise=64",
     "invalid setting falcon.max_rolling_batch_sise='64': expected a known setting "
     "(did you mean falcon.max_rolling_batch_size?); falcon has: batch_size, batching, "),
    # wrong type
    ("falcon.max_rolling_batch_size=many",
     "invalid setting falcon.max_rolling_batch_size='many': expected an integer from 1 to 1024"),
    # out of range
    ("falcon.max_rolling_batch_size=4096",
     "invalid setting falcon.max_rolling_batch_size='4096': expected a value from 1 to 1024"),
    # wrong choice
    ("falcon.dtype=fp8", "invalid setting falcon.dtype='fp8': expected one of fp16, bf16"),
])
def test_bad_setting_is_one_line_with_key_and_allowed_values_and_exit_1(capsys, override, expected):
    code, out, err = run(capsys, "--env", "prod", "-c", override)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: " + expected), err


def test_cli_parses_cdk_args_with_env_and_optional_none(capsys):
    code, out, _ = run(capsys, "-c", "env=prod", "-c", "training.max_train_samples=none",
                       "-c", "network.availability_zones=us-west-2a,us-west-2b")
    assert code == 0
    assert "# environment prod" in out
    assert "training.max_train_samples = none (from -c training.max_train_samples)" in out
    assert "network.availability_zones = us-west-2a,us-west-2b (from -c network.availability_zones)" in out


def test_stacks_settings_entry_point_is_the_same_cli():
    result = subprocess.run([sys.executable, "-m", "stacks.settings", "--env", "prod", "--json"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60, check=True)
    rows = {row["key"]: row for row in json.loads(result.stdout)}
    assert rows["sentiment.min_instances"]["source"] == "cdk.json environments.prod"


def test_settings_sit_below_the_cdk_layer():
    code = ("import sys, settings, settings.cli, settings.schema; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aws_cdk', 'constructs', 'jsii', 'stacks')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_a_reader_that_stops_early_gets_no_traceback():
    """`make settings ENV=prod | head -3`: the pipe closes under the writer, which says nothing more."""
    shell = f"{sys.executable} -m settings --env prod | head -3"
    result = subprocess.run(["bash", "-c", f"set -o pipefail; {shell}"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.splitlines()[0] == "# environment prod" and len(result.stdout.splitlines()) == 3
    assert result.stderr == ""
