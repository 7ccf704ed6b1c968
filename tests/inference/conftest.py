"""Session fixtures: a tiny model packaged by `training.package`, extracted, and the handler file loaded on its own.

Building costs a few seconds (mostly importing torch and transformers), so it happens once per session.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SAMPLE = Path(__file__).resolve().parents[2] / "training" / "data" / "sample" / "train.jsonl"
HANDLER_FILE = Path(__file__).resolve().parents[2] / "inference" / "sentiment" / "inference.py"


def load_code_module(path: Path, name: str) -> ModuleType:
    """Import a handler file under its own module name, apart from the package it lives in."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """A random-weight tiny RoBERTa with the tokenizer trained on the sample, saved like a trained model."""
    from training import tiny

    texts = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines() if line.strip()]
    tokenizer = tiny.build_tokenizer(texts)
    model = tiny.build_model(tokenizer)
    directory = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def bf16_breaks(model_dir, tmp_path_factory) -> Path:
    """The tiny model with 1000 added to every class's bias: exact arithmetic ignores it, bf16 rounds the logits to
    multiples of 4, so bf16 does not answer like fp32 on any CPU (a real failure, through real kernels)."""
    import shutil

    import torch
    from transformers import AutoModelForSequenceClassification

    directory = tmp_path_factory.mktemp("bf16-breaks") / "model"
    shutil.copytree(model_dir, directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory)
    with torch.no_grad():
        model.classifier.out_proj.bias += 1000.0
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def exported(model_dir, tmp_path_factory) -> Path:
    """The tiny RoBERTa with its ONNX graphs (int8 made for the default ml.c7g endpoint) and 40 held-out texts, as an
    archive from training.package carries them (test_calibration and test_arm_check share one worker for it)."""
    import shutil

    from inference.sentiment import accuracy_check, calibration, int8_target, onnx_engine, onnx_export

    directory = tmp_path_factory.mktemp("calibration") / "model"
    shutil.copytree(model_dir, directory)
    onnx_export.export(directory, directory / onnx_engine.ONNX_DIR,
                       int8_target=int8_target.for_instance_type(int8_target.DEFAULT_TARGET))
    calibration.write_texts(directory, accuracy_check.sample_texts()[:40])
    return directory


@pytest.fixture(scope="session")
def archive(model_dir, tmp_path_factory) -> Path:
    """model.tar.gz as training.package builds it for our server (no code/)."""
    from training import package

    output = tmp_path_factory.mktemp("archive") / "model.tar.gz"
    package.build(model_dir, output, gate=False)  # no precision.json: today's archive, served fp32
    return output


@pytest.fixture(scope="session")
def extracted(archive, tmp_path_factory) -> Path:
    """The archive unpacked the way SageMaker unpacks it into /opt/ml/model."""
    directory = tmp_path_factory.mktemp("opt-ml-model")
    with tarfile.open(archive) as tar:
        tar.extractall(directory, filter="data")
    return directory


@pytest.fixture(scope="session")
def handler() -> ModuleType:
    """The handler file loaded on its own (it imports nothing from this repository), as our server's library."""
    return load_code_module(HANDLER_FILE, "shipped_inference")


@pytest.fixture(scope="session")
def loaded(handler, extracted):
    """The model object model_fn returns for the extracted archive."""
    return handler.model_fn(str(extracted))


@pytest.fixture
def invoke(handler, loaded):
    """Run one request through the three per-request hooks; returns the parsed JSON response."""

    def call(body, content_type="application/json", accept="application/json"):
        if isinstance(body, dict | list):
            body = json.dumps(body).encode()
        response, response_type = handler.output_fn(
            handler.predict_fn(handler.input_fn(body, content_type), loaded), accept
        )
        assert response_type == "application/json"
        return json.loads(response)

    return call
