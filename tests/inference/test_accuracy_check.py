"""The accuracy gate for optimized settings: exit status follows the agreement and tolerance thresholds."""

from __future__ import annotations

from inference.sentiment import accuracy_check


def test_int8_is_compared_with_the_unoptimized_model_on_the_sample(model_dir, capsys):
    assert accuracy_check.main(["--model-dir", str(model_dir), "--min-agreement", "0", "--tolerance", "1"]) == 0
    out = capsys.readouterr().out
    texts = len(accuracy_check.sample_texts())
    assert f"int8 vs unoptimized on {texts} sample texts" in out and "PASS" in out
    # No tolerance at all: quantization moves some probability, so the gate fails with status 1.
    assert accuracy_check.main(["--model-dir", str(model_dir), "--tolerance", "0"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_compare_counts_label_flips_and_the_largest_change():
    reference = [[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]
    assert accuracy_check.compare(reference, reference) == (1.0, 0.0)
    agreement, worst = accuracy_check.compare(reference, [[0.6, 0.3, 0.1], [0.1, 0.5, 0.4]])
    assert agreement == 0.5 and abs(worst - 0.2) < 1e-9


def test_not_a_model_dir_exits_2(tmp_path, capsys):
    assert accuracy_check.main(["--model-dir", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
