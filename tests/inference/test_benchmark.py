"""The benchmark runs end to end through the real stack and prints its table; timings are printed, never asserted."""

from __future__ import annotations

import os

import pytest

from inference.sentiment import benchmark_handler, local_stack


@pytest.mark.slow
@pytest.mark.torchserve
@pytest.mark.skipif(not local_stack.SERVING_PYTHON.is_file() and not os.environ.get("REQUIRE_SERVING_STACK"),
                    reason="no .venv-serving; run `make serving-stack`")
def test_benchmark_prints_every_method_for_every_batch_size(model_dir, capsys):
    argv = ["--model-dir", str(model_dir), "--requests", "2", "--warmup", "1", "--batch-sizes", "1,4", "--rounds", "1"]
    assert benchmark_handler.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line[:5].strip().isdigit()]
    assert [(row[0], row[1]) for row in rows] == [
        (size, method) for size in ("1", "4") for method in ("handler", "handler-int8", "pipeline")
    ]
    assert all(row[-1].endswith("x") for row in rows)
    assert [row[-1] for row in rows if row[1] == "pipeline"] == ["1.00x", "1.00x"]
    assert "TorchServe + SageMaker PyTorch toolkit" in out


def test_batches_are_reproducible_and_varied():
    texts = benchmark_handler.sample_texts()
    first = benchmark_handler.make_batches(texts, 8, 3, seed=0)
    assert first == benchmark_handler.make_batches(texts, 8, 3, seed=0)
    assert len(first) == 3 and all(len(batch) == 8 for batch in first)
    assert len({len(text) for batch in first for text in batch}) > 5


def test_bad_arguments(tmp_path, capsys):
    assert benchmark_handler.main(["--model-dir", str(tmp_path / "none")]) == 2
    assert "error: --model-dir" in capsys.readouterr().err
    for argv in (["--batch-sizes", "1,x"], ["--batch-sizes", "0"], ["--requests", "0"], ["--warmup", "-1"]):
        with pytest.raises(SystemExit) as raised:
            benchmark_handler.main(argv)
        assert raised.value.code == 2
