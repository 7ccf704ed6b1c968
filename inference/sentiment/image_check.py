"""The serving image's build-time check: the build stops unless torch, ONNX Runtime and the server are as promised.

Run by inference/sentiment/image/Dockerfile after the locked packages are installed (and by the tests in
.venv-image). Each problem is one line on stderr; exit status 1 when there is any, 2 for a lock it cannot read, 0
with a one-line summary otherwise. Checked:

- torch is the CPU build the lock pins (`--torch-lock`): a CUDA build or another version means the wrong wheel;
- torch was built with oneDNN (`torch.backends.mkldnn`), which bf16 and fast fp32 matmuls on Graviton go through,
  and a small Linear layer runs;
- onnxruntime imports at the version requirements.lock pins (`--lock`), offers its CPU execution provider, and
  runs a small MatMul graph with it (the graph is built here, in bytes: the image has no onnx package, because
  ONNX graphs are exported at package time and read from the model directory, never made at start);
- the server's modules and the packages they import load on this Python (the image's CPython 3.13).

    python -m inference.sentiment.image_check --torch-lock inference/sentiment/image/torch.lock \
        --lock inference/sentiment/image/requirements.lock
"""

from __future__ import annotations

import argparse
import importlib
import re
import struct
import sys
from pathlib import Path

from inference.sentiment.onnx_engine import import_runtime

PROG = "python -m inference.sentiment.image_check"
MODULES = ("transformers", "tokenizers", "safetensors", "torchao", "uvicorn", "starlette",
           "inference.sentiment.inference", "inference.sentiment.precision", "inference.sentiment.cpu_features",
           "inference.sentiment.server.config", "inference.sentiment.server.model", "inference.sentiment.server.app",
           "inference.sentiment.server.__main__")


ONNX_PROVIDER = "CPUExecutionProvider"


def locked(lock: Path, name: str) -> str:
    """The version of `name` a lock file pins (`<name>==<version> \\`)."""
    found = re.search(rf"^{re.escape(name)}==(\S+)", lock.read_text(), re.M)
    if found is None:
        raise ValueError(f"{lock}: no {name}==<version> line")
    return found.group(1)


def locked_torch(lock: Path) -> str:
    """The torch version a lock file pins (`torch==<version> \\`)."""
    return locked(lock, "torch")


def _field(number: int, payload: bytes | str | int) -> bytes:
    """One protobuf field: a varint for an int, length-delimited bytes for str and bytes."""
    def varint(value: int) -> bytes:
        out = bytearray()
        while True:
            out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
            value >>= 7
            if not value:
                return bytes(out)
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(data)) + data


def matmul_graph(rows: int = 8, cols: int = 4, weight: float = 0.25, opset: int = 17) -> bytes:
    """A serialized ONNX model `y = x @ W` (x: [batch, rows] float, W: rows x cols, all `weight`), field numbers
    from onnx/onnx.proto: small enough to write without the onnx package, which the image does not carry."""
    def tensor_type(*dims: bytes) -> bytes:  # TypeProto.tensor_type: elem_type FLOAT (1), shape
        return _field(1, _field(1, 1) + _field(2, b"".join(_field(1, dim) for dim in dims)))
    batch, width = _field(2, "batch"), _field(1, rows)
    weights = (_field(1, rows) + _field(1, cols) + _field(2, 1) + _field(8, "W")
               + _field(9, struct.pack(f"<{rows * cols}f", *[weight] * (rows * cols))))
    graph = (_field(1, _field(1, "x") + _field(1, "W") + _field(2, "y") + _field(4, "MatMul"))
             + _field(2, "image_check") + _field(5, weights)
             + _field(11, _field(1, "x") + _field(2, tensor_type(batch, width)))
             + _field(12, _field(1, "y") + _field(2, tensor_type(batch, _field(1, cols)))))
    return _field(1, 8) + _field(2, "image_check") + _field(7, graph) + _field(8, _field(2, opset))


def onnxruntime_problems(expected: str | None) -> tuple[list[str], str]:
    """(what is wrong with onnxruntime, a summary of what was found)."""
    try:
        onnxruntime = import_runtime()
    except ImportError as error:
        return [f"onnxruntime does not import: {error}"], "onnxruntime missing"
    found: list[str] = []
    if expected is not None and onnxruntime.__version__ != expected:
        found.append(f"onnxruntime {onnxruntime.__version__} installed, the lock pins {expected}")
    providers = onnxruntime.get_available_providers()
    if ONNX_PROVIDER not in providers:
        found.append(f"onnxruntime offers no {ONNX_PROVIDER} (it offers {', '.join(providers) or 'none'})")
    else:
        import numpy
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.log_severity_level = 1, 3
        try:
            session = onnxruntime.InferenceSession(matmul_graph(), options, providers=[ONNX_PROVIDER])
            [out] = session.run(["y"], {"x": numpy.ones((2, 8), numpy.float32)})
        except Exception as error:  # a session that cannot load or run a MatMul is a broken wheel; name it
            found.append(f"onnxruntime cannot run a MatMul graph on {ONNX_PROVIDER}: {type(error).__name__}: {error}")
        else:
            if out.shape != (2, 4) or not bool((out == 2.0).all()):
                found.append(f"onnxruntime's MatMul gave {out.tolist()}, expected 2.0 everywhere in 2 x 4")
    return found, f"onnxruntime {onnxruntime.__version__} ({', '.join(providers)})"


def torch_problems(expected: str | None) -> tuple[list[str], str]:
    """(what is wrong with torch, a summary of what was found)."""
    found: list[str] = []
    try:
        import torch
    except ImportError as error:
        return [f"torch does not import: {error}"], "torch missing"
    if expected is not None and torch.__version__ != expected:
        found.append(f"torch {torch.__version__} installed, the lock pins {expected}")
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
    return found, (f"torch {torch.__version__} (oneDNN {torch.backends.mkldnn.is_available()}, "
                   f"CUDA {torch.version.cuda})")


def problems(expected_torch: str | None, expected_onnxruntime: str | None = None) -> tuple[list[str], str]:
    """(what is wrong, a summary of what was found)."""
    found, torch_summary = torch_problems(expected_torch)
    onnx_found, onnx_summary = onnxruntime_problems(expected_onnxruntime)
    found += onnx_found
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as error:  # any failure to import is a broken image; name it
            found.append(f"{name} does not import: {type(error).__name__}: {error}")
    return found, (f"{torch_summary}, {onnx_summary}, Python {sys.version.split()[0]}, "
                   f"{len(MODULES)} modules import")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-lock", type=Path, help="the torch.lock whose version torch must be")
    parser.add_argument("--lock", type=Path, help="the requirements.lock whose version onnxruntime must be")
    args = parser.parse_args(argv)
    try:
        expected_torch = locked_torch(args.torch_lock) if args.torch_lock else None
        expected_onnxruntime = locked(args.lock, "onnxruntime") if args.lock else None
    except (OSError, ValueError) as error:
        parser.error(str(error))
    found, summary = problems(expected_torch, expected_onnxruntime)
    for line in found:
        print(f"{PROG}: {line}", file=sys.stderr)
    if found:
        return 1
    print(f"image check passed: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
