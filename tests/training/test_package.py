"""training.package: archive layout, refusals, and an offline install from a carried wheelhouse."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from training import package

REPO = Path(__file__).resolve().parents[2]


def make_wheel(directory: Path, name: str, version: str = "1.0", requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel, built here so the test needs no index and no build backend."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {requirement}" for requirement in requires]
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist_info}/METADATA": "\n".join(metadata) + "\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{dist_info}/RECORD,,\n"
    path = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path


@pytest.fixture
def wheelhouse(tmp_path) -> tuple[Path, Path]:
    """Two wheels, one needing the other, and a requirements file naming only the first."""
    house = tmp_path / "wheelhouse"
    house.mkdir()
    make_wheel(house, "sentiment-demo", requires=("sentiment-demo-dep==1.0",))
    make_wheel(house, "sentiment-demo-dep")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# the handler's needs\nsentiment-demo==1.0\n")
    return house, requirements


def members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive, "r:gz") as tar:
        return {info.name: info for info in tar.getmembers()}


def test_layout_matches_the_serving_container(trained, tmp_path, capsys):
    output = tmp_path / "model.tar.gz"
    assert package.main(["--model-dir", str(trained.output_dir), "--output", str(output), "--gate-rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "accuracy gate on" in out and "chosen: " in out
    infos = members(output)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert name in infos, name
    assert {"code/inference.py", "code/requirements.txt"} <= set(infos)
    assert not any(name.startswith("checkpoints") for name in infos), "checkpoints must stay out"
    assert "training_args.bin" not in infos
    assert all(info.mode == 0o644 and info.uid == 0 for info in infos.values() if info.isfile())
    with tarfile.open(output, "r:gz") as tar:
        handler = tar.extractfile("code/inference.py").read()
        requirements = tar.extractfile("code/requirements.txt").read().decode()
    assert handler == (REPO / "inference" / "sentiment" / "inference.py").read_bytes()
    assert "transformers==" in requirements
    assert "--no-index" not in requirements  # no wheelhouse: the endpoint installs from an index


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


def test_wheelhouse_requirements_install_offline(trained, wheelhouse, tmp_path):
    house, requirements = wheelhouse
    output = tmp_path / "model.tar.gz"
    package.build(trained.output_dir, output, requirements_file=requirements, wheelhouse=house, gate=False)
    infos = members(output)
    assert "code/wheels/sentiment_demo-1.0-py3-none-any.whl" in infos
    assert "code/wheels/sentiment_demo_dep-1.0-py3-none-any.whl" in infos

    model_dir = tmp_path / "opt" / "ml" / "model"
    with tarfile.open(output, "r:gz") as tar:
        tar.extractall(model_dir, filter="data")
    text = (model_dir / "code" / "requirements.txt").read_text()
    assert text.splitlines()[:2] == ["--no-index", "--find-links wheels"]
    # As the container does it: pip on the file by absolute path, from some other working directory.
    # An unreachable index makes any attempt to go online fail the install.
    target = tmp_path / "site-packages"
    env = {**os.environ, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    command = [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--target", str(target)]
    done = subprocess.run(
        [*command, "-r", str(model_dir / "code" / "requirements.txt")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "sentiment_demo" / "__init__.py").is_file()
    assert (target / "sentiment_demo_dep" / "__init__.py").is_file(), "the dependency came from the wheelhouse too"


def test_packaging_records_the_gates_choice_and_figures(trained, tmp_path):
    from inference.sentiment import precision

    model = copy_model(trained, tmp_path)
    (model / precision.RECORD).write_text(json.dumps({"precision": "int8", "figures": {}}))  # stale: not copied
    output = tmp_path / "model.tar.gz"
    lines = []
    package.build(model, output, gate_rounds=1, progress=lines.append)
    record = package.read_archive_record(output)
    assert record["precision"] in precision.PRECISIONS and record["figures"] != {}
    assert set(record["figures"]) == set(precision.PRECISIONS)  # every (engine, precision) pair, ONNX Runtime's too
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
    assert any(line.startswith("gate: timing round 1/1") for line in lines)
    # The record sits at the archive root, next to code/, where the server reads it from /opt/ml/model.
    extracted = tmp_path / "opt-ml-model"
    with tarfile.open(output, "r:gz") as tar:
        tar.extractall(extracted, filter="data")
    assert precision.choose(extracted, None) == record["precision"]


def test_skip_gate_writes_no_record_and_the_archive_serves_fp32(trained, tmp_path, capsys):
    from inference.sentiment import precision

    output = tmp_path / "model.tar.gz"
    assert package.main(["--model-dir", str(trained.output_dir), "--output", str(output), "--skip-gate"]) == 0
    assert "no precision.json (--skip-gate)" in capsys.readouterr().out
    assert package.read_archive_record(output) is None
    extracted = tmp_path / "opt-ml-model"
    with tarfile.open(output, "r:gz") as tar:
        tar.extractall(extracted, filter="data")
    assert precision.choose(extracted, None) == "fp32"


def test_wheelhouse_missing_a_dependency_is_refused(trained, wheelhouse, tmp_path):
    house, requirements = wheelhouse
    (house / "sentiment_demo_dep-1.0-py3-none-any.whl").unlink()
    output = tmp_path / "model.tar.gz"
    with pytest.raises(package.PackageError, match=re.escape("do not cover sentiment-demo==1.0")):
        package.build(trained.output_dir, output, requirements_file=requirements, wheelhouse=house)
    assert not output.exists()


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


def test_refuses_an_output_that_is_not_tar_gz(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    output = tmp_path / "model.zip"
    assert package.main(["--model-dir", str(model), "--output", str(output)]) == 2
    assert "must end in .tar.gz" in capsys.readouterr().err
    assert not output.exists()


def test_refuses_an_empty_wheelhouse(trained, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    refuse(
        copy_model(trained, tmp_path),
        tmp_path,
        capsys,
        "no .whl files",
        extra=("--wheelhouse", str(tmp_path / "empty")),
    )
