"""The gate's shared pieces and its command line; the precision gate itself is tested in test_precision.py."""

from __future__ import annotations

from inference.sentiment import accuracy_check


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


def test_the_gate_times_torch_under_the_servers_openmp_policy(model_dir):
    """A fresh `python -m ...accuracy_check` (torch not loaded yet) runs with the server's OMP_WAIT_POLICY, and says so
    in its record; a policy the user set is kept."""
    import json
    import os
    import subprocess
    import sys

    from inference.sentiment.server import config

    command = [sys.executable, "-m", "inference.sentiment.accuracy_check", "--model-dir", str(model_dir),
               "--no-export", "--rounds", "1", "--json"]
    env = {name: value for name, value in os.environ.items() if name != "OMP_WAIT_POLICY"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=True)
    record = json.loads(done.stdout)
    assert record["speed"]["measured_on"]["omp_wait_policy"] == "PASSIVE"
    assert config.torch_runtime_defaults({})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert config.torch_runtime_defaults({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_report_says_which_int8_weights_were_made_for_which_cpu_and_when_this_cpu_understates_them():
    from inference.sentiment import precision as precisions

    made = {"method": "quantize_dynamic(weight_type=QInt8, reduce_range=False) after quant_pre_process",
            "weight_bits": 8, "target": "ml.c7g.4xlarge", "why": "c7g is Graviton (Arm): ..."}
    exported = {"exporter": "torch.onnx.export", "opset": 17, "versions": {"onnxruntime": "1.32.0"},
                "graphs": {"onnx-fp32": "model.fp32.onnx", "onnx-int8": "model.int8.onnx"}, "errors": {},
                "seconds": 1.0, "int8": made}
    lines = {}
    for bits in (8, 7):  # the weights this packaging CPU would need: 7 where its int8 kernel saturates
        measured_on = {"machine": "x86_64", "cpu": "a CPU", "bf16_instructions": False, "threads": 2,
                       "torch": "2.13.0", "int8_weight_bits": bits}
        record = precisions.make_record([precisions.Figures("fp32", 1.0, 0.0, 10.0)], texts=114, sample=["x"],
                                        batch_texts=16, rounds=1, measured_on=measured_on, onnx_export=exported)
        lines[bits] = accuracy_check.report(record)
    assert "int8 graph: 8-bit weights for ml.c7g.4xlarge (c7g is Graviton (Arm): ...)" in lines[8]
    assert not any("saturates" in line for line in lines[8])
    assert ("  (this CPU's int8 kernel saturates 8-bit weights: onnx-int8's figures here are worse than on the CPU "
            "the graph is made for)") in lines[7]
