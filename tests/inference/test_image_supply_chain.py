"""The serving image's supply chain without Docker (issue 32): hashed locks that agree with the pins, a base digest
moved by a tool, and the build's torch/oneDNN and ONNX Runtime check (issue 35), which fails the build rather than
printing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from inference.sentiment import image_check
from inference.sentiment.image import supply_chain
from tests.conftest import REPO_ROOT, prerequisite

IMAGE_DIR = REPO_ROOT / "inference" / "sentiment" / "image"
IMAGE_PYTHON = REPO_ROOT / ".venv-image" / "bin" / "python"
NEW_DIGEST = "sha256:" + "ab" * 32
# sha256 of onnxruntime-1.32.0-cp313-cp313-manylinux_2_28_aarch64.whl, the wheel the image installs, as PyPI serves
# it (`pip download onnxruntime==1.32.0 --platform manylinux_2_28_aarch64 --python-version 3.13 --only-binary=:all:`
# then sha256sum, 2026-12-04).
ONNXRUNTIME_AARCH64_CP313 = "54d02baff2df38777b4c3cc7af326406fe8b8a48f54720f4c446d2d327920a79"
needs_image_venv = prerequisite(IMAGE_PYTHON.exists(), "needs .venv-image (make image-venv)")


def test_the_locks_agree_with_the_pins_and_every_entry_is_hashed():
    assert supply_chain.lock_problems() == []
    hashes = supply_chain.hashes(IMAGE_DIR / "requirements.lock")
    assert len(hashes) == len(supply_chain.pins(IMAGE_DIR / "requirements.txt")) - 1  # all but torch
    # PyTorch's CPU aarch64 cp313 torch, as https://download.pytorch.org/whl/cpu/torch/ lists it.
    assert "0b8f7d0423027ae8b90c7977c627f3379f325363a08224dffad9b4b2d684a83d" in \
        supply_chain.hashes(IMAGE_DIR / "torch.lock")["torch"]


def test_the_lock_carries_onnxruntime_for_aarch64_cp313_and_no_exporter():
    pins = supply_chain.pins(IMAGE_DIR / "requirements.lock")
    assert {name: pins.get(name) for name in ("onnxruntime", "flatbuffers", "protobuf")} == {
        "onnxruntime": "1.32.0", "flatbuffers": "25.12.19", "protobuf": "6.33.6"}
    assert ONNXRUNTIME_AARCH64_CP313 in supply_chain.hashes(IMAGE_DIR / "requirements.lock")["onnxruntime"]
    # ONNX graphs are exported and quantized at package time, not in the image: nothing that makes them is locked.
    assert not {"onnx", "onnxscript", "optimum", "optimum-onnx", "ml-dtypes"} & set(pins)


def test_a_lock_that_drifts_from_the_pins_is_named(tmp_path):
    for name in ("requirements.txt", "requirements.lock", "torch.lock"):
        shutil.copy(IMAGE_DIR / name, tmp_path / name)
    pins = tmp_path / "requirements.txt"
    pins.write_text(pins.read_text().replace("uvicorn==0.55.0", "uvicorn==0.56.0").replace(
        "torch==2.13.0", "torch==2.14.0"))
    lock = tmp_path / "requirements.lock"
    lock.write_text(re.sub(r"(?m)^(starlette==\S+ \\\n)(    --hash=\S+( \\)?\n)+", r"starlette==1.10.0\n",
                           lock.read_text()))
    problems = supply_chain.lock_problems(pins, lock, tmp_path / "torch.lock")
    assert "torch.lock pins torch 2.13.0+cpu, requirements.txt 2.14.0 (expected 2.14.0+cpu)" in problems
    assert "uvicorn: requirements.txt pins 0.56.0, requirements.lock has 0.55.0" in problems
    assert "requirements.lock: starlette has no valid sha256 --hash" in problems
    assert problems[-1].startswith("re-lock with `make image-lock`")


def test_bump_base_rewrites_only_the_digest(tmp_path, capsys):
    dockerfile = tmp_path / "Dockerfile"
    shutil.copy(IMAGE_DIR / "Dockerfile", dockerfile)
    before = dockerfile.read_text()
    argv = ["bump-base", "--digest", NEW_DIGEST, "--dockerfile", str(dockerfile)]
    assert supply_chain.main(argv) == 0
    after = dockerfile.read_text()
    assert f"ARG BASE_IMAGE=public.ecr.aws/docker/library/python:3.13-slim-trixie@{NEW_DIGEST}\n" in after
    assert [a for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b] == [
        line for line in before.splitlines() if line.startswith("ARG BASE_IMAGE=")]
    assert f"-> public.ecr.aws/docker/library/python:3.13-slim-trixie@{NEW_DIGEST}" in capsys.readouterr().out
    assert supply_chain.main([*argv, "--tag", "3.13.15-slim-trixie"]) == 0
    assert f"python:3.13.15-slim-trixie@{NEW_DIGEST}\n" in dockerfile.read_text()


@pytest.mark.parametrize(("argv", "message"), [
    (["--digest", "sha256:abc"], "--digest 'sha256:abc': expected sha256: followed by 64 lowercase hex digits"),
    (["--digest", "AB" * 32], "expected sha256: followed by 64 lowercase hex digits"),
    (["--digest", NEW_DIGEST, "--tag", "bad tag"], "--tag 'bad tag': not a valid image tag"),
])
def test_bump_base_refuses_what_is_not_a_digest(tmp_path, capsys, argv, message):
    dockerfile = tmp_path / "Dockerfile"
    shutil.copy(IMAGE_DIR / "Dockerfile", dockerfile)
    assert supply_chain.main(["bump-base", *argv, "--dockerfile", str(dockerfile)]) == 2
    assert message in capsys.readouterr().err
    assert dockerfile.read_text() == (IMAGE_DIR / "Dockerfile").read_text()


def test_bump_base_runs_from_make_with_help():
    done = subprocess.run([sys.executable, "-m", "inference.sentiment.image.supply_chain", "bump-base", "--help"],
                          cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "--digest" in done.stdout
    assert "$(PY) -m inference.sentiment.image.supply_chain bump-base --digest $(DIGEST)" in \
        (REPO_ROOT / "Makefile").read_text()


def _image_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(IMAGE_PYTHON), *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


@needs_image_venv
def test_the_image_check_passes_on_the_locked_packages():
    """The same command the Dockerfile runs, in .venv-image (the image's locked packages on this machine)."""
    done = _image_check("-m", "inference.sentiment.image_check", "--torch-lock", str(IMAGE_DIR / "torch.lock"),
                        "--lock", str(IMAGE_DIR / "requirements.lock"))
    assert done.returncode == 0, done.stderr
    assert re.match(r"image check passed: torch 2\.13\.0\+cpu \(oneDNN True, CUDA None\), onnxruntime 1\.32\.0 "
                    r"\([^)]*CPUExecutionProvider[^)]*\), Python 3\.\d+\.\d+, \d+ modules import$",
                    done.stdout.strip()), done.stdout


@needs_image_venv
def test_the_image_check_fails_on_another_or_a_missing_onnxruntime(tmp_path):
    """In .venv-image, with its real onnxruntime 1.32.0: a lock pinning 1.31.0 fails the check, and so does
    onnxruntime made unimportable (None in sys.modules is how Python marks a module that must not import)."""
    lock = tmp_path / "requirements.lock"
    lock.write_text((IMAGE_DIR / "requirements.lock").read_text().replace("onnxruntime==1.32.0", "onnxruntime==1.31.0"))
    script = ("import sys\nfrom inference.sentiment import image_check\n"
              f"print('other', image_check.main(['--lock', {str(lock)!r}]), flush=True)\n"
              "sys.modules['onnxruntime'] = None\n"
              f"print('missing', image_check.main(['--lock', {str(IMAGE_DIR / 'requirements.lock')!r}]))\n")
    done = _image_check("-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["other 1", "missing 1"], done.stdout
    errors = done.stderr.splitlines()
    assert f"{image_check.PROG}: onnxruntime 1.32.0 installed, the lock pins 1.31.0" in errors
    assert any(line.startswith(f"{image_check.PROG}: onnxruntime does not import: ") for line in errors), errors
    assert len([line for line in errors if "onnxruntime" in line]) == 2, errors  # nothing else names it


def test_the_image_check_names_another_torch_and_one_without_onednn(monkeypatch):
    import torch
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    found, _ = image_check.torch_problems("2.14.0+cpu")
    assert found == [f"torch {torch.__version__} installed, the lock pins 2.14.0+cpu",
                     "torch was built without oneDNN (torch.backends.mkldnn.is_available() is False)"]
    assert image_check.locked_torch(IMAGE_DIR / "torch.lock") == "2.13.0+cpu"
    assert image_check.locked(IMAGE_DIR / "requirements.lock", "onnxruntime") == "1.32.0"


def test_the_checks_matmul_graph_is_valid_onnx_and_runs():
    """The graph image_check writes in bytes (the image has no onnx package) against onnx's own checker, and run."""
    import numpy
    import onnx
    import onnxruntime

    model = onnx.load_from_string(image_check.matmul_graph())
    onnx.checker.check_model(model, full_check=True)
    assert [node.op_type for node in model.graph.node] == ["MatMul"] and model.opset_import[0].version == 17
    session = onnxruntime.InferenceSession(image_check.matmul_graph(), providers=["CPUExecutionProvider"])
    [out] = session.run(None, {"x": numpy.arange(16, dtype=numpy.float32).reshape(2, 8)})
    assert out.tolist() == [[7.0] * 4, [23.0] * 4]  # each row's sum times 0.25
