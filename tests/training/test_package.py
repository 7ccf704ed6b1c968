"""training.package: archive layout (ours without code/, the toolkit baseline's with its handler), refusals."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from inference.sentiment import cpu_features
from training import package


def members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive, "r:gz") as tar:
        return {info.name: info for info in tar.getmembers()}


@dataclass(frozen=True)
class Packaged:
    archive: Path
    out: str  # what the CLI printed: the report
    err: str  # its progress lines


@pytest.fixture(scope="module")
def packaged(trained, tmp_path_factory) -> Packaged:
    """`python -m training.package` with the gate, once for the module (the export and the gate take seconds), on a
    copy of the trained model that carries a stale precision.json (which must not be copied)."""
    from inference.sentiment import precision

    scratch = tmp_path_factory.mktemp("packaged")
    model = copy_model(trained, scratch)
    (model / precision.RECORD).write_text(json.dumps({"precision": "int8", "figures": {}}))
    output = scratch / "model.tar.gz"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = package.main(["--model-dir", str(model), "--output", str(output), "--gate-rounds", "1"])
    assert status == 0, out.getvalue() + err.getvalue()
    return Packaged(output, out.getvalue(), err.getvalue())


def test_layout_matches_the_serving_container(packaged):
    out = packaged.out
    assert "wrote" in out and "accuracy gate on" in out and "chosen: " in out
    # The default endpoint is a c7g: the int8 graph's weights are made for Graviton, and the report says so.
    assert ("int8 graph: 8-bit weights for ml.c7g.4xlarge (c7g is Graviton (Arm): int8 dot products accumulate in "
            "int32, 8-bit weights)") in out
    infos = members(packaged.archive)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert name in infos, name
    # No code/: our serving image carries the handler and every package (the retired TorchServe image needed them).
    assert not any(name.startswith("code") for name in infos), sorted(infos)
    assert not any(name.startswith("checkpoints") for name in infos), "checkpoints must stay out"
    assert "training_args.bin" not in infos
    # The gate's held-out texts travel with the model, for the accuracy check on the serving CPU (issue 44).
    with tarfile.open(packaged.archive, "r:gz") as tar:
        assert json.loads(tar.extractfile(package.CALIBRATION_TEXTS).read()) == package.held_out_texts()
    assert all(info.mode == 0o644 and info.uid == 0 for info in infos.values() if info.isfile())


def test_the_toolkit_baseline_archive_carries_its_handler_as_code_inference_py(trained, tmp_path):
    """make bench-handler's toolkit row: SageMaker's PyTorch toolkit imports code/inference.py, nothing else."""
    from inference.sentiment.benchmark_server import BASELINE_HANDLER

    output = tmp_path / "pipeline.tar.gz"
    names = package.build(trained.output_dir, output, handler=BASELINE_HANDLER, gate=False)
    assert [name for name in names if name.startswith("code")] == ["code/inference.py"]
    with tarfile.open(output, "r:gz") as tar:
        assert tar.extractfile("code/inference.py").read() == BASELINE_HANDLER.read_bytes()
    with pytest.raises(package.PackageError, match=r"--handler .*missing\.py: no such file"):
        package.build(trained.output_dir, tmp_path / "none.tar.gz", handler=tmp_path / "missing.py", gate=False)


def test_archive_model_loads_after_extraction(trained, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    output = tmp_path / "model.tar.gz"
    package.build(trained.output_dir, output, gate=False)
    extracted = tmp_path / "opt-ml-model"
    with tarfile.open(output, "r:gz") as tar:
        tar.extractall(extracted, filter="data")
    model = AutoModelForSequenceClassification.from_pretrained(extracted)
    tokenizer = AutoTokenizer.from_pretrained(extracted)
    logits = model(**tokenizer(["what a day"], return_tensors="pt")).logits
    assert logits.shape == (1, 3)


def test_packaging_records_the_gates_choice_and_figures(packaged, tmp_path):
    from inference.sentiment import precision

    output = packaged.archive
    record = package.read_archive_record(output)
    assert record["precision"] in precision.PRECISIONS and record["figures"] != {}  # the stale record was not copied
    # every (engine, precision) pair this CPU runs, ONNX Runtime's too
    assert set(record["figures"]) == {name for name in precision.PRECISIONS
                                      if not precision.cpu_reason(name, cpu_features.this_cpu())}
    with tarfile.open(output, "r:gz") as tar:
        assert {"onnx/model.fp32.onnx", "onnx/model.int8.onnx", "onnx/export.json"} <= set(tar.getnames())
    assert record["figures"]["onnx-fp32"]["max_change"] < 1e-4 and record["figures"]["onnx-fp32"]["passed"]
    fp32 = record["figures"]["fp32"]
    assert fp32["agreement"] == 1.0 and fp32["max_change"] == 0.0 and fp32["ms_per_batch"] > 0 and fp32["passed"]
    for name, figures in record["figures"].items():
        assert figures["passed"] == (figures["agreement"] >= 0.99 and figures["max_change"] <= 0.05), name
    gate = record["gate"]
    assert gate["min_agreement"] == 0.99 and gate["max_probability_change"] == 0.05 and gate["texts"] >= 100
    assert gate["measured_on"]["torch"].startswith("2.13") and gate["rounds"] == 1
    assert any(line.startswith("gate: timing round 1/1") for line in packaged.err.splitlines())
    # The record sits at the archive root, where the server reads it from /opt/ml/model.
    extracted = tmp_path / "opt-ml-model"
    with tarfile.open(output, "r:gz") as tar:
        tar.extractall(extracted, filter="data")
    assert precision.read_record(extracted) == record


def test_skip_gate_writes_no_record_and_no_graphs_and_the_server_chooses_among_torchs_pairs(trained, tmp_path,
                                                                                           capsys):
    from inference.sentiment import calibration
    from inference.sentiment.cpu_features import this_cpu

    output = tmp_path / "model.tar.gz"
    assert package.main(["--model-dir", str(trained.output_dir), "--output", str(output), "--skip-gate"]) == 0
    assert "no precision.json and no ONNX graphs (--skip-gate)" in capsys.readouterr().out
    assert package.read_archive_record(output) is None
    extracted = tmp_path / "opt-ml-model"
    with tarfile.open(output, "r:gz") as tar:
        tar.extractall(extracted, filter="data")
    names, skipped = calibration.candidates(extracted, None, this_cpu())
    assert set(names) <= {"fp32", "bf16", "int8"} and {"onnx-fp32", "onnx-int8"} <= set(skipped)


def copy_model(trained, tmp_path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(trained.output_dir, target, ignore=shutil.ignore_patterns("checkpoints"))
    return target


def refuse(model_dir: Path, tmp_path: Path, capsys, *fragments: str, extra: tuple[str, ...] = ()) -> None:
    output = tmp_path / "out" / "model.tar.gz"
    assert package.main(["--model-dir", str(model_dir), "--output", str(output), *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m training.package: error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert not output.exists()


def test_refuses_a_trainer_checkpoint(trained, tmp_path, capsys):
    checkpoint = sorted((trained.output_dir / "checkpoints").glob("checkpoint-*"))[0]
    refuse(checkpoint, tmp_path, capsys, "a Trainer checkpoint", "optimizer.pt")


def test_refuses_a_missing_directory(tmp_path, capsys):
    refuse(tmp_path / "nothing", tmp_path, capsys, "no such directory")


def test_refuses_a_model_without_config(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    (model / "config.json").unlink()
    refuse(model, tmp_path, capsys, "no config.json")


def test_refuses_a_config_that_does_not_load(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    (model / "config.json").write_text("{not json")
    refuse(model, tmp_path, capsys, "config.json does not load")


def test_refuses_the_wrong_number_of_labels(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["id2label"] = {"0": "NEGATIVE", "1": "POSITIVE"}
    config["label2id"] = {"NEGATIVE": 0, "POSITIVE": 1}
    (model / "config.json").write_text(json.dumps(config))
    refuse(model, tmp_path, capsys, "2 labels", "expected 3")


def test_refuses_missing_weights(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    (model / "model.safetensors").unlink()
    refuse(model, tmp_path, capsys, "no weights")


def test_refuses_truncated_weights(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    refuse(model, tmp_path, capsys, "model.safetensors is truncated")


def test_refuses_a_model_without_tokenizer(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    (model / "tokenizer_config.json").unlink()
    refuse(model, tmp_path, capsys, "no tokenizer_config.json")


def test_refuses_a_serving_target_that_is_not_an_instance_type(trained, tmp_path, capsys):
    output = tmp_path / "model.tar.gz"
    with pytest.raises(SystemExit) as stopped:
        package.main(["--model-dir", str(trained.output_dir), "--output", str(output), "--serve-on", "c7g.large"])
    assert stopped.value.code == 2
    assert "--serve-on 'c7g.large': not a SageMaker instance type such as ml.c7g.4xlarge, nor 'this-cpu'" in \
        capsys.readouterr().err
    assert not output.exists()


def test_refuses_an_output_that_is_not_tar_gz(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    output = tmp_path / "model.zip"
    assert package.main(["--model-dir", str(model), "--output", str(output)]) == 2
    assert "must end in .tar.gz" in capsys.readouterr().err
    assert not output.exists()
