"""The statistics on known timings: percentiles, rates, error accounting, and the report files built from them."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference.llm import loadtest_report as reports
from inference.llm.loadtest_report import Sample


def test_percentiles_interpolate_linearly_between_ranks():
    values = [0.4, 0.1, 0.3, 0.2, 0.5]  # unsorted on purpose
    assert reports.percentile(values, 0) == 0.1
    assert reports.percentile(values, 50) == 0.3
    assert reports.percentile(values, 100) == 0.5
    # rank (5 - 1) * 0.9 = 3.6: 0.4 + 0.6 * (0.5 - 0.4)
    assert reports.percentile(values, 90) == pytest.approx(0.46)
    assert reports.percentile(values, 99) == pytest.approx(0.496)
    assert reports.percentile([1, 2, 3, 4], 50) == 2.5


def test_percentile_edge_cases():
    assert reports.percentile([], 50) is None
    assert reports.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        reports.percentile([1.0], 101)


@given(st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=1, max_size=200),
       st.sampled_from([0, 1, 25, 50, 90, 99, 99.9, 100]))
def test_percentile_matches_numpy_default(values, q):
    assert reports.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-9)


def known_step():
    """Ten requests over 2 s of wall time: 7 succeed (latencies 0.1..0.7 s, 5 tokens each), 3 fail."""
    ok = [Sample(latency=0.1 * i, ttfb=0.01 * i, output=5) for i in range(1, 8)]
    failed = [Sample(latency=0.01, error="5xx", detail="HTTP 503: busy"),
              Sample(latency=0.02, error="throttled", detail="HTTP 429"),
              Sample(latency=1.0, error="timeout", detail="no answer")]
    warmup = [Sample(latency=0.5, output=5), Sample(latency=0.5, error="connection")]
    return reports.summarize(ok + failed, wall_s=2.0, concurrency=4, warmup=warmup)


def test_rates_count_successes_over_the_step_wall_time():
    step = known_step()
    assert step["requests"] == 10 and step["ok"] == 7 and step["error_count"] == 3
    assert step["error_rate"] == pytest.approx(0.3)
    assert step["requests_per_s"] == pytest.approx(3.5)
    assert step["output_total"] == 35
    assert step["output_per_s"] == pytest.approx(17.5)
    assert step["warmup_requests"] == 2 and step["warmup_errors"] == 1


def test_latency_ignores_failed_requests():
    latency = known_step()["latency_s"]
    assert latency["p50"] == pytest.approx(0.4)
    assert latency["p90"] == pytest.approx(0.64)  # rank 5.4 between 0.6 and 0.7
    assert latency["p99"] == pytest.approx(0.694)
    assert latency["mean"] == pytest.approx(0.4)
    assert latency["min"] == pytest.approx(0.1) and latency["max"] == pytest.approx(0.7)
    assert known_step()["ttfb_s"]["p50"] == pytest.approx(0.04)


def test_errors_are_counted_by_kind_with_an_example():
    step = known_step()
    assert step["errors"] == {"throttled": 1, "4xx": 0, "5xx": 1, "timeout": 1, "connection": 0, "other": 0}
    assert step["error_examples"]["5xx"] == "HTTP 503: busy"
    unknown = reports.summarize([Sample(0.1, error="weird")], 1.0, 1)
    assert unknown["errors"]["other"] == 1


def test_empty_step_and_missing_ttfb():
    empty = reports.summarize([], wall_s=0.0, concurrency=1)
    assert empty["requests"] == 0 and empty["error_rate"] == 0.0
    assert empty["requests_per_s"] is None and empty["latency_s"] is None
    no_ttfb = reports.summarize([Sample(0.2, output=3)], wall_s=1.0, concurrency=1)
    assert no_ttfb["ttfb_s"] is None and no_ttfb["latency_s"]["p90"] == 0.2


def test_passed_compares_each_step_with_the_limit():
    assert reports.passed([known_step()], 0.3)
    assert not reports.passed([known_step()], 0.29)
    assert reports.passed([], 0.0)


def report_with(step: dict, unit: str = "tokens") -> dict:
    return {"label": "known", "kind": "llm", "shape": {"input_tokens": 32, "output_tokens": 128},
            "target": {"type": "http", "url": "http://127.0.0.1:1/invocations"}, "unit": unit,
            "token_counter": "whitespace words", "steps": [step]}


def test_table_lists_every_step_aligned():
    table = reports.format_table(report_with(known_step()))
    lines = table.splitlines()
    assert lines[0].startswith("known: llm 32 in / 128 out -> http://127.0.0.1:1/invocations")
    header, rule, row = lines[1], lines[2], lines[3]
    assert "tok/s" in header and "p90 s" in header and "ttfb p50 s" in header
    assert set(rule.replace(" ", "")) == {"-"}
    assert row.index("3.50") + len("3.50") == header.index("req/s") + len("req/s")  # numbers right-aligned
    assert row.split()[:5] == ["4", "10", "3", "30.0", "3.50"]
    assert "throttled 1, 5xx 1, timeout 1" in row
    assert "whitespace words" in lines[4]
    assert lines[5:] == ["first throttled error: HTTP 429", "first 5xx error: HTTP 503: busy",
                         "first timeout error: no answer"]  # in the order of the kinds, not of arrival


def test_csv_has_one_row_per_step_and_blank_missing_values(tmp_path):
    report = report_with(reports.summarize([Sample(0.2, output=3)], 1.0, 2))
    paths = reports.write_reports(report, tmp_path / "out")
    assert [path.name for path in paths] == ["report.json", "report.csv"]
    rows = list(csv.DictReader(io.StringIO(paths[1].read_text())))
    assert len(rows) == 1 and rows[0]["concurrency"] == "2" and rows[0]["output_total"] == "3"
    assert rows[0]["ttfb_p50_s"] == "" and rows[0]["errors_5xx"] == "0"
    assert json.loads(paths[0].read_text())["steps"][0]["ok"] == 1


def test_load_report_rejects_other_json(tmp_path):
    other = tmp_path / "other.json"
    other.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"other\.json"):
        reports.load_report(other)
