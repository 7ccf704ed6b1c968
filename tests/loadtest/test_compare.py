"""--compare redraws saved runs into one picture without traffic; the tool still works without matplotlib."""

from __future__ import annotations

import json
import sys

from inference.llm import loadtest, loadtest_report
from inference.llm.loadtest_report import Sample

PNG = b"\x89PNG\r\n\x1a\n"


def saved_run(path, label, scale):
    """A report.json like a three-step sweep would write, with made-up but plausible numbers."""
    steps = [loadtest_report.summarize([Sample(0.5 * concurrency / scale, output=128)] * 8, 2.0, concurrency)
             for concurrency in (1, 4, 16)]
    report = {"tool": "inference.llm.loadtest", "label": label, "kind": "llm", "unit": "tokens",
              "shape": {"input_tokens": 32, "output_tokens": 128}, "token_counter": "tokenizer falcon",
              "target": {"type": "sagemaker", "endpoint": label, "region": "us-west-2"}, "steps": steps}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report))
    return path


def test_compare_draws_two_runs_into_one_png(tmp_path, capsys):
    first = saved_run(tmp_path / "dynamic" / "report.json", "dynamic", 1)
    second = saved_run(tmp_path / "rolling" / "report.json", "rolling", 4)
    assert loadtest.main(["--compare", str(first), str(second), "--out", str(tmp_path / "both")]) == 0
    picture = tmp_path / "both" / "compare.png"
    assert picture.read_bytes()[:8] == PNG and picture.stat().st_size > 10_000
    tables = capsys.readouterr().out
    assert "dynamic: llm 32 in / 128 out" in tables and "rolling: llm 32 in / 128 out" in tables


def test_compare_keeps_runs_with_the_same_label_apart(tmp_path, capsys):
    first = saved_run(tmp_path / "a" / "report.json", "same", 1)
    second = saved_run(tmp_path / "b" / "report.json", "same", 2)
    assert loadtest.main(["--compare", str(first), str(second), "--out", str(tmp_path)]) == 0
    assert "same (2): llm" in capsys.readouterr().out


def test_compare_refuses_files_that_are_not_reports(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert loadtest.main(["--compare", str(bad), "--out", str(tmp_path)]) == 2
    assert "bad.json: not a report.json" in capsys.readouterr().err


def test_without_matplotlib_the_table_and_files_still_come(fake_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    out = tmp_path / "out"
    status = loadtest.main(["--url", fake_server.url, "--requests", "2", "--warmup", "0", "--out", str(out),
                            "--no-progress"])
    assert status == 0
    assert (out / "report.json").exists() and (out / "report.csv").exists() and not (out / "report.png").exists()
    assert "matplotlib is not installed" in capsys.readouterr().err
