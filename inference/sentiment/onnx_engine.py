"""ONNX Runtime behind the handler's forward-pass seam: the graphs `training.package` exported, run the way the
server runs torch.

`inference.sentiment.inference.predict_encoded` calls `model.model(**batch).logits` on a batch of padded torch
tensors. `OnnxClassifier` has that call shape: it feeds the graph the inputs it was exported with and returns an
object whose `.logits` is a torch tensor, so the batcher, the queue and the bucket plan do not know which engine
runs. Nothing is exported, optimised to disk or downloaded here: the archive carries the graphs
(`onnx/model.fp32.onnx`, `onnx/model.int8.onnx`, written by `inference.sentiment.onnx_export` at package time)
and ONNX Runtime builds its session from them at start, with the pair's own options (`SESSION_CONFIG`).

Sessions: the CPU execution provider; intra-op threads = the replica's threads (the server's OMP_NUM_THREADS),
inter-op 1, idle threads sleep instead of spinning (the server sets OMP_WAIT_POLICY=PASSIVE for torch for the same
reason: spinning workers starved the event loop on 2 vCPUs). One session per replica: torch gives each calling
thread its own OpenMP team, and so does this, where one shared session would make concurrent replicas take turns
on one thread pool.

ONNX Runtime's telemetry is off wherever our code imports it (`import_runtime`). Its Linux wheels (1.32.0) collect
usage telemetry by default for upload to Microsoft: importing onnxruntime writes a persistent device id and an event
database under ~/.cache/Microsoft/DeveloperTools/.onnxruntime and a `.ses` file into TMPDIR (seen here, and in
microsoft/onnxruntime#32476), unless it detects CI (CI, GITHUB_ACTIONS, CODEBUILD_BUILD_ID, ...). An endpoint, a
training instance or a test run has no business sending that, so
`ORT_DISABLE_TELEMETRY=1` (the variable the 1.32.0 library reads: `strings` on its `onnxruntime_pybind11_state`
module) is set before the first import unless the environment already sets it; the serving image sets it too.

This module imports only the standard library at import time (the server decides its engine before importing
torch or ONNX Runtime).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import queue
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ONNX_DIR = "onnx"
TELEMETRY_ENV = "ORT_DISABLE_TELEMETRY"
# Which graph each ONNX Runtime pair of `inference.sentiment.precision` runs.
GRAPHS = {"onnx-fp32": "model.fp32.onnx", "onnx-int8": "model.int8.onnx", "onnx-bf16-fastmath": "model.fp32.onnx"}
# Session options a pair adds to the common ones. `onnx-bf16-fastmath` is the fp32 graph with MLAS's bf16 fast math:
# fp32 MatMul computed by bf16 matrix instructions (BFMMLA) where the CPU has them. ONNX Runtime reads the option
# on aarch64 Linux only (onnxruntime/core/providers/cpu/math/matmul.cc at 001d12d2, `#if defined(__aarch64__) &&
# defined(__linux__)`: MatMul without transposes whose weight has at least kFastMathModeKernelsizeThreshold
# elements), so elsewhere the pair would be onnx-fp32 under another name (`precision.cpu_reason` keeps it off).
# Unlike oneDNN's math mode it is per session: each MatMul kernel reads it from its own session's options when the
# session is built (matmul.h's constructor), so an onnx-fp32 session in the same process stays fp32.
# Seen under QEMU (`make check-arm`, Neoverse V1): it moves the tiny model's probabilities by about 0.005; on x86
# by 0.0.
SESSION_CONFIG = {"onnx-bf16-fastmath": {"mlas.enable_gemm_fastmath_arm64_bfloat16": "1"}}
MANIFEST = "export.json"
OUTPUT = "logits"


def import_runtime(module: str = "onnxruntime"):
    """`module` (onnxruntime or one of its submodules), imported with ONNX Runtime's telemetry off (module docstring).
    The library reads the variable when it first loads, so every import of ours goes through here."""
    os.environ.setdefault(TELEMETRY_ENV, "1")
    return importlib.import_module(module)


def runtime_installed() -> bool:
    """Whether ONNX Runtime can be imported here, without importing it."""
    return importlib.util.find_spec("onnxruntime") is not None


def graph_path(model_dir: Path, precision: str, onnx_dir: Path | None = None) -> Path:
    """Where `precision`'s graph lives for this model (`<model_dir>/onnx/` unless the gate was given another)."""
    return Path(onnx_dir if onnx_dir is not None else Path(model_dir) / ONNX_DIR) / GRAPHS[precision]


def read_manifest(directory: Path) -> dict | None:
    """The export's own record (what was exported, with which versions, or why not); None without one."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return {"error": f"{path} does not parse"}


def missing_reason(model_dir: Path, precision: str, onnx_dir: Path | None = None) -> str | None:
    """Why `precision`'s graph cannot run here (None when it can): no graph in the model (packaged before the
    export, or the export failed: its recorded reason), or no ONNX Runtime in this environment."""
    directory = Path(onnx_dir if onnx_dir is not None else Path(model_dir) / ONNX_DIR)
    if not graph_path(model_dir, precision, onnx_dir).is_file():
        manifest = read_manifest(directory) or {}
        exported_as = next(name for name, graph in GRAPHS.items() if graph == GRAPHS[precision])  # the export's key
        failure = (manifest.get("errors") or {}).get(exported_as) or manifest.get("error")
        if failure:
            return f"no {ONNX_DIR}/{GRAPHS[precision]}: the export failed at packaging ({failure})"
        return f"no {ONNX_DIR}/{GRAPHS[precision]} in the model (packaged before ONNX export)"
    if not runtime_installed():
        return "onnxruntime is not installed in this environment"
    return None


@dataclass(frozen=True)
class Output:
    """What a transformers classifier's forward returns, as far as the handler reads it."""

    logits: Any


class OnnxClassifier:
    """A sequence classifier run by ONNX Runtime, called like the transformers model it was exported from."""

    def __init__(self, path: Path, *, threads: int, replicas: int = 1, config: dict[str, str] | None = None):
        onnxruntime = import_runtime()

        self.path = Path(path)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # errors only: its warnings about unused initialisers are noise per start
        self.config = dict(config or {})
        for key, value in self.config.items():
            options.add_session_config_entry(key, value)
        self._sessions: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(max(1, replicas)):
            session = onnxruntime.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
            self._sessions.put(session)
        self.input_names = tuple(entry.name for entry in session.get_inputs())
        self.threads = threads
        self.replicas = max(1, replicas)

    def __call__(self, **batch) -> Output:
        import torch

        missing = [name for name in self.input_names if name not in batch]
        if missing:
            raise ValueError(f"{self.path.name} takes {', '.join(self.input_names)}; the batch lacks "
                             f"{', '.join(missing)}")
        feed = {name: _as_int64(batch[name]) for name in self.input_names}
        session = self._sessions.get()  # one replica's session; another replica runs its own meanwhile
        try:
            (logits,) = session.run([OUTPUT], feed)
        finally:
            self._sessions.put(session)
        return Output(torch.from_numpy(logits))

    def eval(self) -> OnnxClassifier:  # what callers of a torch module may do; a session has no training mode
        return self

    def __repr__(self) -> str:
        extra = f", config={self.config}" if self.config else ""
        return f"OnnxClassifier({self.path}, threads={self.threads}, replicas={self.replicas}{extra})"


def _as_int64(value):
    import numpy

    if hasattr(value, "numpy"):
        value = value.detach().cpu().numpy()
    return numpy.ascontiguousarray(value, dtype=numpy.int64)
