"""The choice on the serving CPU (issue 44): every pair the archive carries and this CPU runs is checked for accuracy
on this CPU's kernels, the passing ones timed in turns, the fastest kept loaded; an override is still checked.

Real models, real kernels: the tiny RoBERTa with its exported graphs, and copies of it that a real kernel gets wrong
(a large, equal bias on every class: exact arithmetic ignores it, bf16's 8-bit mantissa rounds the logits to
multiples of 4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inference.sentiment import accuracy_check, calibration
from inference.sentiment import precision as precisions
from inference.sentiment.cpu_features import Bf16Support

TEXTS = accuracy_check.sample_texts()[:40]
BF16_CPU = Bf16Support(True, "x86_64: all 2 processors have amx_bf16", "x86_64")
NO_BF16_CPU = Bf16Support(False, "aarch64: 2 of 2 processors list no bf16 in Features", "aarch64")
ARM_BF16_CPU = Bf16Support(True, "aarch64: all 2 processors list bf16 in Features", "aarch64")
# What an x86 CPU runs: ONNX Runtime's bf16 fast math is an aarch64 kernel (`precision.cpu_reason`).
X86_PAIRS = [name for name in precisions.PRECISIONS if name != "onnx-bf16-fastmath"]


@pytest.fixture(scope="module")
def int8_breaks(model_dir, tmp_path_factory) -> Path:
    """The tiny model whose last hidden state carries one channel at a constant 1000 that the classifier ignores:
    exact arithmetic never sees it; dynamic int8, which quantizes a whole activation tensor with one scale, rounds
    every other channel to nothing."""
    import torch
    from transformers import AutoModelForSequenceClassification

    directory = tmp_path_factory.mktemp("int8-breaks") / "model"
    shutil.copytree(model_dir, directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory)
    with torch.no_grad():
        norm = model.roberta.encoder.layer[-1].output.LayerNorm
        norm.weight[0], norm.bias[0] = 0.0, 1000.0
        model.classifier.dense.weight[:, 0] = 0.0
    model.save_pretrained(directory)
    calibration.write_texts(directory, TEXTS)
    return directory


def test_a_model_whose_int8_fails_on_this_cpu_is_served_on_a_passing_pair_with_the_figures(int8_breaks):
    done = calibration.calibrate(int8_breaks, threads=1, cpu=BF16_CPU)
    int8 = {entry.precision: entry for entry in done.figures}["int8"]
    assert not int8.passed() and (int8.agreement < precisions.MIN_AGREEMENT or int8.max_change > precisions.TOLERANCE)
    assert done.chosen in ("fp32", "bf16") and f"int8 FAIL (agree {int8.agreement:.1%}, " in done.line


def test_every_pair_is_checked_here_and_the_fastest_passing_one_is_kept_loaded(exported):
    from inference.sentiment import inference as handler

    done = calibration.calibrate(exported, threads=1, cpu=BF16_CPU)
    assert [entry.precision for entry in done.figures] == X86_PAIRS
    assert done.skipped == {"onnx-bf16-fastmath": precisions.cpu_reason("onnx-bf16-fastmath", BF16_CPU)}
    passing = {entry.precision: entry.ms_per_batch for entry in done.figures if entry.passed()}
    assert done.chosen in passing and "fp32" in passing
    timed = {name: ms for name, ms in passing.items() if ms is not None}
    assert timed[done.chosen] == min(timed.values())  # the fastest by its best round (two may tie at 0.01 ms)
    # The chosen pair is the one loaded, and it answers through the handler.
    [answer] = handler.predict_fn(handler.Request(["what a lovely day"]), done.sentiment)
    assert answer["label"] in done.sentiment.labels
    line = done.line
    assert line.startswith(f"calibration: serving {done.chosen} ({precisions.label(done.chosen)}), the fastest pair "
                           "that answers like fp32 here, in ")
    assert all(f"{name} PASS" in line or f"{name} FAIL" in line for name in X86_PAIRS)
    assert "; not run here: onnx-bf16-fastmath: ONNX Runtime's bf16 fast math is an aarch64 kernel" in line
    assert line.endswith(f"CPU: {BF16_CPU.evidence}")


def test_a_pair_that_fails_here_is_not_served_and_its_figures_say_why(bf16_breaks):
    done = calibration.calibrate(bf16_breaks, threads=1, cpu=BF16_CPU)
    figures = {entry.precision: entry for entry in done.figures}
    bf16 = figures["bf16"]  # logits rounded to multiples of 4: near-equal classes tie, the best label moves
    assert bf16.agreement < precisions.MIN_AGREEMENT and not bf16.passed(), bf16
    assert figures["fp32"].passed() and figures["int8"].passed()
    assert done.chosen != "bf16" and figures[done.chosen].passed()
    assert f"bf16 FAIL (agree {bf16.agreement:.1%}, max change {bf16.max_change:.4f})" in done.line


def test_an_override_is_checked_on_this_cpu_and_refused_with_its_figures(bf16_breaks):
    with pytest.raises(precisions.PrecisionRefused, match=r"SENTIMENT_PRECISION=bf16 does not answer like fp32 on "
                                                          r"this CPU: bf16: labels agree .* FAIL \(x86_64: "):
        calibration.calibrate(bf16_breaks, override="bf16", threads=1, cpu=BF16_CPU)


def test_an_override_that_passes_is_served_without_a_race_and_with_its_own_math_mode(exported):
    import torch

    done = calibration.calibrate(exported, override="fp32", threads=1, cpu=BF16_CPU)
    assert done.chosen == "fp32" and [entry.precision for entry in done.figures] == ["fp32"]
    assert "SENTIMENT_PRECISION=fp32, which answers like fp32 here" in done.line
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"  # a torch fp32 pair runs fp32 kernels
    done = calibration.calibrate(exported, override="BF16 ", threads=1, cpu=BF16_CPU)
    assert done.chosen == "bf16" and [entry.precision for entry in done.figures] == ["fp32", "bf16"]
    assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"  # oneDNN's fast math for the bf16 pair only
    calibration.calibrate(exported, override="fp32", threads=1, cpu=BF16_CPU)
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"


def test_candidates_are_what_the_archive_carries_and_this_cpu_runs(exported, model_dir):
    assert calibration.candidates(exported, None, ARM_BF16_CPU) == (list(precisions.PRECISIONS), {})
    names, skipped = calibration.candidates(exported, None, BF16_CPU)
    assert names == X86_PAIRS and list(skipped) == ["onnx-bf16-fastmath"]
    assert skipped["onnx-bf16-fastmath"].endswith(f"this CPU: {BF16_CPU.evidence}")
    names, skipped = calibration.candidates(exported, None, NO_BF16_CPU)  # Graviton2: no bf16 of either engine
    assert names == ["fp32", "int8", "onnx-fp32", "onnx-int8"] and set(skipped) == {"bf16", "onnx-bf16-fastmath"}
    names, skipped = calibration.candidates(model_dir, None, NO_BF16_CPU)  # no onnx/ graphs, no bf16
    assert names == ["fp32", "int8"]
    assert skipped["bf16"] == f"this CPU has no bf16 instructions ({NO_BF16_CPU.evidence})"
    assert set(skipped) == {"bf16", "onnx-fp32", "onnx-int8", "onnx-bf16-fastmath"}
    assert skipped["onnx-bf16-fastmath"].startswith("no onnx/model.fp32.onnx in the model")
    with pytest.raises(precisions.PrecisionRefused, match=r"SENTIMENT_PRECISION=onnx-bf16-fastmath \(ONNX Runtime "
                                                          r"fp32 graph, bf16 fast math \(aarch64\)\) cannot run: ONNX "
                                                          r"Runtime's bf16 fast math is an aarch64 kernel"):
        calibration.candidates(exported, "onnx-bf16-fastmath", BF16_CPU)
    with pytest.raises(precisions.PrecisionRefused, match=r"SENTIMENT_PRECISION=onnx-int8 \(ONNX Runtime int8 "
                                                          r"\(dynamic\)\) cannot run: "):
        calibration.candidates(model_dir, "onnx-int8", NO_BF16_CPU)
    with pytest.raises(ValueError, match=r"SENTIMENT_PRECISION='fp16' is not a precision; allowed: fp32, bf16"):
        calibration.candidates(model_dir, "fp16", NO_BF16_CPU)


def test_a_pair_far_behind_the_leader_leaves_the_race_and_the_leader_is_served(exported, monkeypatch):
    """With DROP_FACTOR 1, every pair but the leader leaves after the second round, whatever this CPU's speeds."""
    monkeypatch.setattr(calibration, "DROP_FACTOR", 1.0)
    done = calibration.calibrate(exported, threads=1, cpu=BF16_CPU)
    passing = [entry.precision for entry in done.figures if entry.passed()]
    assert sorted([*done.dropped, done.chosen]) == sorted(passing)
    assert all(why.endswith("dropped after round 2") for why in done.dropped.values()), done.dropped
    assert "not timed to the end: " in done.line


def test_past_the_budget_the_best_pair_measured_so_far_wins(exported):
    lines = []
    done = calibration.calibrate(exported, threads=1, cpu=BF16_CPU, budget_s=1e-6, progress=lines.append)
    assert "calibration: budget of 1e-06 s spent after round 1" in lines
    timed = {entry.precision: entry.ms_per_batch for entry in done.figures if entry.ms_per_batch is not None}
    assert timed[done.chosen] == min(timed.values()) and list(timed) == X86_PAIRS


def test_onnx_runtimes_bf16_fast_math_runs_the_fp32_graph_with_its_session_option(exported):
    """The pair on an aarch64 CPU with bf16, as `make check-arm` runs it under QEMU; here, on x86, ONNX Runtime
    takes the option and ignores it, so the pair must answer exactly as onnx-fp32 does."""
    done = calibration.calibrate(exported, override="onnx-bf16-fastmath", threads=1, cpu=ARM_BF16_CPU)
    assert done.chosen == "onnx-bf16-fastmath" and done.figures[-1].passed()
    assert done.figures[-1].max_change <= 1e-6
    engine = done.sentiment.model
    assert engine.path.name == "model.fp32.onnx"
    session = engine._sessions.get()
    assert session.get_session_options().get_session_config_entry(
        "mlas.enable_gemm_fastmath_arm64_bfloat16") == "1"


def test_an_archive_without_held_out_texts_is_checked_on_the_gates_own_sample(model_dir, tmp_path, monkeypatch):
    """Archives packaged before they shipped texts: the gate's sample, which the serving image carries; without it
    too, one clear error. A texts file that is not a list of texts is refused by name."""
    done = calibration.calibrate(model_dir, override="fp32", threads=1, cpu=BF16_CPU)
    assert f"{len(accuracy_check.sample_texts())} held-out texts, the gate's sample (calibration/texts.json not in " \
           "the archive)" in done.line
    monkeypatch.setattr(accuracy_check, "SAMPLE_DIR", tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"missing/validation\.jsonl"):
        calibration.calibrate(model_dir, override="fp32", threads=1, cpu=BF16_CPU)
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "texts.json").write_text(json.dumps({"not": "a list"}))
    with pytest.raises(ValueError, match=r"texts\.json: not a list of texts"):
        calibration.read_texts(tmp_path)


def test_the_cli_reads_an_archive_and_prints_the_one_line(archive_with_texts, capsys):
    assert calibration.main(["--model-dir", str(archive_with_texts), "--threads", "1", "--precision", "fp32"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("calibration: serving fp32 (torch fp32), SENTIMENT_PRECISION=fp32")


@pytest.fixture
def archive_with_texts(archive) -> Path:
    """The session's archive from training.package: it ships the held-out texts."""
    import tarfile

    with tarfile.open(archive) as tar:
        assert "calibration/texts.json" in tar.getnames()
    return archive


def test_the_budget_comes_from_the_endpoints_environment_and_a_wrong_one_names_the_variable():
    from inference.sentiment.server.config import ConfigError, from_env

    assert from_env({}).calibration_seconds == calibration.DEFAULT_BUDGET_S == 60
    assert from_env({"SENTIMENT_CALIBRATION_SECONDS": "120"}).calibration_seconds == 120
    with pytest.raises(ConfigError, match=r"SENTIMENT_CALIBRATION_SECONDS=0: must be between 1 and 1800"):
        from_env({"SENTIMENT_CALIBRATION_SECONDS": "0"})
