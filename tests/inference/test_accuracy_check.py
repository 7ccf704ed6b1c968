"""The TorchServe handler's sentiment.quantize check (accuracy_check --quantize int8) and the gate's shared pieces;
the precision gate itself is tested in test_precision.py."""

from __future__ import annotations

from inference.sentiment import accuracy_check


def test_int8_is_compared_with_the_unoptimized_model_on_the_sample(model_dir, capsys):
    assert accuracy_check.main(["--model-dir", str(model_dir), "--quantize", "int8", "--min-agreement", "0",
                                "--tolerance", "1"]) == 0
    out = capsys.readouterr().out
    texts = len(accuracy_check.sample_texts())
    assert f"int8 vs unoptimized on {texts} sample texts" in out and "PASS" in out
    # No tolerance at all: quantization moves some probability, so the gate fails with status 1.
    assert accuracy_check.main(["--model-dir", str(model_dir), "--quantize", "int8", "--tolerance", "0"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_compare_counts_label_flips_and_the_largest_change():
    reference = [[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]
    assert accuracy_check.compare(reference, reference) == (1.0, 0.0)
    agreement, worst = accuracy_check.compare(reference, [[0.6, 0.3, 0.1], [0.1, 0.5, 0.4]])
    assert agreement == 0.5 and abs(worst - 0.2) < 1e-9


def test_not_a_model_dir_exits_2(tmp_path, capsys):
    assert accuracy_check.main(["--model-dir", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_bad_numbers_are_refused_by_name(model_dir, capsys):
    import pytest

    with pytest.raises(SystemExit) as stopped:
        accuracy_check.main(["--model-dir", str(model_dir), "--rounds", "0"])
    assert stopped.value.code == 2 and "--rounds 0: must be at least 1" in capsys.readouterr().err
