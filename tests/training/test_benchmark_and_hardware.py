"""The benchmark's CLI and the hardware plan that decides which speed-ups a machine runs."""

from __future__ import annotations

import json

import pytest

from training import benchmark, hardware


def test_benchmark_prints_both_runs_and_their_ratio(tmp_path, capsys):
    result = tmp_path / "bench.json"
    argv = ["--no-torch-compile", "--steps", "2", "--warmup", "1", "--seq-len", "16", "--json", str(result)]
    assert benchmark.main(argv) == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "optimized" in out
    assert "speed-up optimized/baseline:" in out and "1.42x" in out
    summary = json.loads(result.read_text())
    baseline, optimized = summary["results"]
    assert (baseline["bf16"], baseline["torch_compile"], baseline["fused_adamw"]) == (False, False, False)
    assert optimized["fused_adamw"] is True and optimized["torch_compile"] is False
    assert baseline["samples_per_second"] > 0 and optimized["samples_per_second"] > 0
    assert summary["speedup"] == pytest.approx(optimized["samples_per_second"] / baseline["samples_per_second"])
    assert summary["model_size"] == "tiny"


def test_benchmark_names_what_the_cpu_lacks(monkeypatch, capsys):
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: False)
    assert benchmark.main(["--no-torch-compile", "--steps", "1", "--warmup", "1", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    assert "left out: bf16 (this CPU has no native bf16)" in out


def test_benchmark_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["--help"])
    assert exit_info.value.code == 0
    assert "--steps" in capsys.readouterr().out


def test_plan_on_a_cpu_without_bf16_or_compiler(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(hardware, "has_compiler", lambda: False)
    speed = hardware.plan(bf16=True, torch_compile=True, fused_adamw=True, tf32=True)
    assert (speed.device, speed.bf16, speed.torch_compile, speed.fused_adamw, speed.tf32) == (
        "cpu", False, False, True, False,
    )  # fmt: skip
    line = speed.summary()
    assert "\n" not in line
    assert "bf16 off (this CPU has no native bf16)" in line
    assert "torch.compile off (no C++ compiler" in line
    assert "fused AdamW on" in line


def test_plan_keeps_what_the_cpu_can_do(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(hardware, "has_compiler", lambda: True)
    speed = hardware.plan(bf16=True, torch_compile=False, fused_adamw=True, tf32=None)
    assert speed.bf16 and not speed.torch_compile and speed.turned_off == {}
    assert "torch.compile off (not requested)" in speed.summary()


def test_training_logs_the_plan_in_one_line(monkeypatch, tmp_path, capsys):
    from tests.training.conftest import sample_args
    from training import train_sentiment

    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: False)
    assert train_sentiment.main(sample_args(tmp_path / "model", "--max-steps", "1")) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "device cpu:" in line]
    assert len(lines) == 1
    assert "bf16 off (this CPU has no native bf16)" in lines[0]
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert metrics["effective"]["bf16"] is False
    assert metrics["effective"]["turned_off"] == {"bf16": "this CPU has no native bf16"}
