"""`make train-local` prints no warning a user cannot act on; the filters that make it so drop only their message.

The run is `make train-local` itself (its installs taken as done), with the output folder moved to a temporary one:
about 20-40 s on 2 CPU cores, once per session.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path

import pytest

from common import library_warnings
from common.library_warnings import UNACTIONABLE, drop_unactionable_library_warnings

REPO_ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = REPO_ROOT / "Makefile"


def foreign_warnings(output: str) -> list[str]:
    """Lines saying WARNING or Warning, or starting as torch's own log format starts a warning (`W1204 13:43:54...`),
    that are not ours (our loggers are training.* and inference.*; our files live here, not in site-packages)."""
    ours = re.compile(r"WARNING (training|inference)\.|^" + re.escape(str(REPO_ROOT)) + r"/(?!\.venv)")
    warning = re.compile(r"WARNING|Warning|^W\d{4} \d")
    return [line for line in output.splitlines() if warning.search(line) and not ours.search(line)]


@pytest.fixture(scope="module")
def train_local(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`make train-local` itself (its installs taken as done), writing into a temporary folder."""
    model = tmp_path_factory.mktemp("train-local") / "tiny-model"
    done = subprocess.run(["make", "--no-print-directory", "-o", "install-dev", "train-local", f"LOCAL_MODEL={model}"],
                          cwd=REPO_ROOT, env={**os.environ, "MAKEFLAGS": ""}, capture_output=True, text=True,
                          timeout=600)
    return done, model


@pytest.mark.slow
def test_make_train_local_prints_no_library_warning(train_local):
    done, _ = train_local
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "prediction: 'Covid cases are increasing fast!' ->" in output
    foreign = foreign_warnings(output)
    assert foreign == [], "\n".join(foreign) + "\n---\n" + output[-2000:]
    assert "Loading weights" not in output  # transformers' progress bar, once per model the gate loads


def test_make_train_local_packages_the_archive_the_endpoint_would_load(train_local):
    """Issue 44: the first local run is the endpoint's path: the gate's record, the ONNX graphs with int8 weights
    for the default ml.c7g endpoint, and a model.tar.gz that `make serve-local` serves by default."""
    from training import package

    done, model = train_local
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    archive = model.parent / f"{model.name}.tar.gz"
    assert {"config.json", "precision.json", "onnx/model.fp32.onnx", "onnx/model.int8.onnx"} <= set(
        package.verify_archive(archive))
    record = package.read_archive_record(archive)
    assert record["gate"]["onnx_export"]["int8"]["target"] == "ml.c7g.4xlarge"
    assert f"wrote {archive}" in done.stdout and "chosen: " in done.stdout
    # ... and what `make serve-local` serves when no MODEL is given (make -n: the command, not run)
    serve = subprocess.run(["make", "--no-print-directory", "-n", "-o", "image-venv", "serve-local",
                            f"LOCAL_MODEL={model}"], cwd=REPO_ROOT, env={**os.environ, "MAKEFLAGS": ""},
                           capture_output=True, text=True, timeout=60)
    assert f"-m inference.sentiment.server serve --model-dir {archive} " in serve.stdout, serve.stdout + serve.stderr


def test_a_foreign_warning_is_caught_and_ours_is_not():
    output = "\n".join([
        "2026-12-04 13:43:54,031 WARNING torchao: Failed to load x.so",
        "W1204 13:43:54.271000 6395 /x/site-packages/torch/utils/_pytree.py:630] <enum 'K'> is an Enum subclass",
        "/x/site-packages/transformers/trainer.py:1: FutureWarning: something",
        "2026-12-04 13:43:56,172 WARNING training.train_sentiment: bf16 off",
        f"{REPO_ROOT}/training/train_sentiment.py:9: UserWarning: ours",
    ])
    assert len(foreign_warnings(output)) == 3


def _record(logger: str, message: str, *args) -> logging.LogRecord:
    return logging.LogRecord(logger, logging.WARNING, __file__, 1, message, args, None)


class TorchaoEnum:  # stands in for torchao's KernelPreference: what the filter reads is the class's module
    __module__ = "torchao.quantization.quantize_.common.kernel_preference"


class OtherEnum:
    __module__ = "somebody.else"


# transformers 5.20 trainer_utils.sort_checkpoints, when the checkpoints it rotates are less than 1 s apart.
MTIME = "mtime may not be reliable on this filesystem, falling back to numerical ordering"
PYTREE = "%s is an Enum subclass and is now natively supported by torch.compile ... register_constant() ..."


@pytest.mark.parametrize(("logger", "record", "dropped"), [
    ("torchao", _record("torchao", "Failed to load /v/site-packages/torchao/_C_mxfp8.so: Could not load"), True),
    ("torchao", _record("torchao", "Skipping import of cpp extensions due to incompatible torch version"), False),
    ("torchao.kernel.intmm", _record("torchao.kernel.intmm", "Warning: Detected no triton, on systems ..."), True),
    ("torchao.kernel.intmm", _record("torchao.kernel.intmm", "another warning"), False),
    ("torch.utils._pytree", _record("torch.utils._pytree", PYTREE, TorchaoEnum), True),
    ("torch.utils._pytree", _record("torch.utils._pytree", PYTREE, OtherEnum), False),
    ("transformers.trainer_utils", _record("transformers.trainer_utils", MTIME), True),
    ("transformers.trainer_utils", _record("transformers.trainer_utils", "Some other Trainer warning"), False),
])
def test_each_filter_drops_only_its_message(monkeypatch, logger, record, dropped):
    monkeypatch.setattr(library_warnings, "_torch_without_cuda", lambda: True)
    assert UNACTIONABLE[logger](record) is dropped


@pytest.mark.parametrize("logger", ["torchao", "torchao.kernel.intmm"])
def test_with_cuda_torch_a_kernel_or_triton_message_is_kept(monkeypatch, logger):
    """There a kernel that fails to load, or a missing Triton, is something the user can fix."""
    monkeypatch.setattr(library_warnings, "_torch_without_cuda", lambda: False)
    message = "Failed to load /v/site-packages/torchao/_C_mxfp8.so: x" if logger == "torchao" else "Detected no triton"
    assert UNACTIONABLE[logger](_record(logger, message)) is False


def test_the_cpu_check_reads_the_loaded_torch():
    import torch

    assert library_warnings._torch_without_cuda() is (torch.version.cuda is None)


def test_filters_are_installed_once_by_the_packages():
    import training  # noqa: F401  (installs them, as inference.sentiment does)

    drop_unactionable_library_warnings()
    for name in UNACTIONABLE:
        installed = [item for item in logging.getLogger(name).filters if isinstance(item, library_warnings._Drop)]
        assert len(installed) == 1, name
