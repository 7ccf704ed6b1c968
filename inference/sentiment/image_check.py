"""The serving image's build-time check: the build stops unless torch and the server are what the image promises.

Run by inference/sentiment/image/Dockerfile after the locked packages are installed (and by the tests in
.venv-image). Each problem is one line on stderr; exit status 1 when there is any, 0 with a one-line summary
otherwise. Checked:

- torch is the CPU build the lock pins (`--torch-lock`): a CUDA build or another version means the wrong wheel;
- torch was built with oneDNN (`torch.backends.mkldnn`), which bf16 and fast fp32 matmuls on Graviton go through,
  and a small Linear layer runs;
- the server's modules and the packages they import load on this Python (the image's CPython 3.13).

    python -m inference.sentiment.image_check --torch-lock inference/sentiment/image/torch.lock
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

PROG = "python -m inference.sentiment.image_check"
MODULES = ("transformers", "tokenizers", "safetensors", "torchao", "uvicorn", "starlette",
           "inference.sentiment.inference", "inference.sentiment.precision", "inference.sentiment.cpu_features",
           "inference.sentiment.server.config", "inference.sentiment.server.model", "inference.sentiment.server.app",
           "inference.sentiment.server.__main__")


def locked_torch(lock: Path) -> str:
    """The torch version a lock file pins (`torch==<version> \\`)."""
    found = re.search(r"^torch==(\S+)", lock.read_text(), re.M)
    if found is None:
        raise ValueError(f"{lock}: no torch==<version> line")
    return found.group(1)


def problems(expected_torch: str | None) -> tuple[list[str], str]:
    """(what is wrong, a summary of what was found)."""
    found: list[str] = []
    try:
        import torch
    except ImportError as error:
        return [f"torch does not import: {error}"], ""
    if expected_torch is not None and torch.__version__ != expected_torch:
        found.append(f"torch {torch.__version__} installed, the lock pins {expected_torch}")
    if torch.version.cuda is not None:
        found.append(f"torch is a CUDA build (CUDA {torch.version.cuda}), not the CPU build")
    if not torch.backends.mkldnn.is_available():
        found.append("torch was built without oneDNN (torch.backends.mkldnn.is_available() is False)")
    else:
        layer = torch.nn.Linear(8, 4)
        with torch.inference_mode():
            out = layer(torch.ones(2, 8))
        if tuple(out.shape) != (2, 4) or not bool(torch.isfinite(out).all()):
            found.append("a Linear layer gave a wrong or non-finite result")
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as error:  # any failure to import is a broken image; name it
            found.append(f"{name} does not import: {type(error).__name__}: {error}")
    summary = (f"torch {torch.__version__} (oneDNN {torch.backends.mkldnn.is_available()}, "
               f"CUDA {torch.version.cuda}), Python {sys.version.split()[0]}, {len(MODULES)} modules import")
    return found, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-lock", type=Path, help="the torch.lock whose version torch must be")
    args = parser.parse_args(argv)
    expected = locked_torch(args.torch_lock) if args.torch_lock else None
    found, summary = problems(expected)
    for line in found:
        print(f"{PROG}: {line}", file=sys.stderr)
    if found:
        return 1
    print(f"image check passed: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
