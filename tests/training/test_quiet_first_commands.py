"""`make train-local` prints no warning a user cannot act on; the filters that make it so drop only their message.

The run is the Makefile's own recipe (read from the Makefile, so a changed recipe is what gets tested), with the
output folder moved to a temporary one: about 20-40 s on 2 CPU cores, once per session.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from common import library_warnings
from common.library_warnings import UNACTIONABLE, drop_unactionable_library_warnings

REPO_ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = REPO_ROOT / "Makefile"


def make_recipe(target: str) -> tuple[list[str], dict[str, str]]:
    """The target's command, continuation lines joined, and the variables the Makefile exports."""
    lines = MAKEFILE.read_text().splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().removesuffix("\\").strip())
    exports = dict(re.findall(r"^export (\w+) := (.*)$", MAKEFILE.read_text(), flags=re.MULTILINE))
    return shlex.split(" ".join(recipe)), exports


def foreign_warnings(output: str) -> list[str]:
    """Lines saying WARNING or Warning, or starting as torch's own log format starts a warning (`W1204 13:43:54...`),
    that are not ours (our loggers are training.* and inference.*; our files live here, not in site-packages)."""
    ours = re.compile(r"WARNING (training|inference)\.|^" + re.escape(str(REPO_ROOT)) + r"/(?!\.venv)")
    warning = re.compile(r"WARNING|Warning|^W\d{4} \d")
    return [line for line in output.splitlines() if warning.search(line) and not ours.search(line)]


@pytest.fixture(scope="module")
def train_local(tmp_path_factory) -> subprocess.CompletedProcess:
    command, exports = make_recipe("train-local")
    assert command[:3] == ["$(PY)", "-m", "training.train_sentiment"], command
    output_dir = tmp_path_factory.mktemp("train-local") / "tiny-model"
    command = [sys.executable, *command[1:]]
    command[command.index("--output-dir") + 1] = str(output_dir)
    return subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, **exports}, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_make_train_local_prints_no_library_warning(train_local):
    output = train_local.stdout + train_local.stderr
    assert train_local.returncode == 0, output[-3000:]
    assert "prediction: 'Covid cases are increasing fast!' ->" in output
    foreign = foreign_warnings(output)
    assert foreign == [], "\n".join(foreign) + "\n---\n" + output[-2000:]


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
