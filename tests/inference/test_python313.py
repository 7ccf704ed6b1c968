"""The server under CPython 3.13, the image's Python (issue 32), as far as this machine allows.

`make image-venv-py313` builds .venv-image-py313 from a CPython 3.13 found here (pyenv's or on PATH) with the image's
locked, hashed versions of the packages the server's pure-Python layers import (Starlette, uvicorn, anyio, h11,
click, idna). This test runs, with that interpreter, the tests of those layers: the HTTP app over ASGI
(test_server_app.py), the batcher (test_server_batcher.py), the CPU-feature check and the precision choice
(test_cpu_precision.py), and imports every server module that loads without torch.

What does not run under 3.13 here: anything that loads the model (torch, transformers, tokenizers), hence the
server process tests (test_server.py) and the image's own build. PyPI's x86_64 torch 2.13.0 is the
CUDA build (several GB, never pulled), and no CPU build for CPython 3.13 is on this machine's disk; the image
installs the aarch64 CPU build for 3.13, which the Dockerfile's image_check imports at build time.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import REPO_ROOT, prerequisite

PYTHON = REPO_ROOT / ".venv-image-py313" / "bin" / "python"
TESTS = ("tests/inference/test_server_app.py", "tests/inference/test_server_batcher.py",
         "tests/inference/test_cpu_precision.py")
# Every server module that imports without torch (model.py and the handler import torch lazily, inside functions).
MODULES = ("inference.sentiment.server.app", "inference.sentiment.server.batcher", "inference.sentiment.server.config",
           "inference.sentiment.server.model", "inference.sentiment.server.__main__", "inference.sentiment.inference",
           "inference.sentiment.precision", "inference.sentiment.cpu_features", "inference.sentiment.container")


def _python313() -> str | None:
    """A CPython 3.13 on this machine, as the Makefile looks for one (None: none here)."""
    found = subprocess.run(["make", "--no-print-directory", "-s", "-f", "Makefile", "--eval",
                            "print-py313: ; @echo $(PY313)", "print-py313"], cwd=REPO_ROOT, capture_output=True,
                           text=True, check=False)
    return found.stdout.strip() or None


pytestmark = [
    pytest.mark.skipif(not PYTHON.exists() and _python313() is None,
                       reason="no CPython 3.13 on this machine (pyenv or python3.13 on PATH): the server's 3.13 run "
                              "needs one; make image-venv-py313 builds its venv where there is"),
    prerequisite(PYTHON.exists(), "a CPython 3.13 is here but .venv-image-py313 is not: make image-venv-py313"),
]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run([str(PYTHON), *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False,
                          timeout=timeout, env={**env, "HF_HUB_OFFLINE": "1"})


def test_the_venv_is_cpython_313_with_the_images_pins_and_no_torch():
    done = _run("-c", "import sys, importlib.util as u, starlette, uvicorn; print(sys.implementation.name, "
                      "'%d.%d' % sys.version_info[:2], starlette.__version__, uvicorn.__version__, "
                      "u.find_spec('torch') is None)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cpython", "3.13", "1.10.0", "0.55.0", "True"]


def test_the_server_modules_import_under_313():
    done = _run("-c", f"import importlib; [importlib.import_module(name) for name in {MODULES!r}]; print('ok')")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_servers_pure_python_tests_pass_under_313():
    """The tests marked py313 in TESTS; the others there need torch or pydantic, which this venv leaves out."""
    done = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-m", "py313", *TESTS, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    assert "skipped" not in summary, summary
