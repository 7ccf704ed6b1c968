"""What the current machine can do, so training and benchmark switch off only what it cannot.

Every decision that differs on a GPU lives here as a function the tests call on a CPU with the real
torch APIs: the speed-up plan (bf16, TF32, fused AdamW), reading and setting the TF32 precision, the
hardware report that goes into metrics.json, and the launch check for several GPUs.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

FEATURES = {"bf16": "bf16", "torch_compile": "torch.compile", "fused_adamw": "fused AdamW", "tf32": "tf32"}


def cpu_has_bf16() -> bool:
    """True when oneDNN reports native bf16 on this CPU (AVX512-BF16/AMX on x86, BF16 on Arm)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a private op; absent from some builds
        return False


def has_compiler() -> bool:
    """torch.compile's CPU backend (inductor) generates and builds C++, so it needs a compiler."""
    return any(shutil.which(name) for name in (os.environ.get("CXX", "g++"), "g++", "clang++", "c++"))


@dataclass
class Plan:
    """The speed-ups this machine will run, and why each requested one that it won't is off."""

    device: str
    bf16: bool
    torch_compile: bool
    fused_adamw: bool
    tf32: bool | None  # None: leave it to transformers (on with torch.compile on Ampere+)
    turned_off: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One log line: every speed-up's state, with the reason for the ones the hardware vetoed."""
        parts = []
        for name, shown in FEATURES.items():
            value = getattr(self, name)
            if name in self.turned_off:
                parts.append(f"{shown} off ({self.turned_off[name]})")
            elif value is None:
                parts.append(f"{shown} default")
            else:
                parts.append(f"{shown} {'on' if value else 'off (not requested)'}")
        return f"device {self.device}: " + ", ".join(parts)


def gpu_plan(capability: tuple[int, int], bf16_supported: bool, bf16: bool, torch_compile: bool,
             fused_adamw: bool, tf32: bool | None) -> Plan:
    """The plan on a CUDA GPU of this compute capability: bf16 and TF32 need Ampere (8.0) or newer."""
    major, minor = capability
    off: dict[str, str] = {}
    if bf16 and not bf16_supported:
        bf16, off["bf16"] = False, f"GPU compute capability {major}.{minor} has no bf16"
    if tf32 and major < 8:
        tf32, off["tf32"] = False, "needs an Ampere or newer GPU"
    return Plan("cuda", bf16, torch_compile, fused_adamw, tf32, off)


def cpu_plan(bf16: bool, torch_compile: bool, fused_adamw: bool, tf32: bool | None) -> Plan:
    """The plan on a CPU: bf16 where oneDNN has it natively, compile where a C++ compiler exists, never TF32."""
    off: dict[str, str] = {}
    if bf16 and not cpu_has_bf16():
        bf16, off["bf16"] = False, "this CPU has no native bf16"
    if torch_compile and not has_compiler():
        torch_compile, off["torch_compile"] = False, "no C++ compiler for the CPU backend"
    if tf32:
        tf32, off["tf32"] = False, "a CUDA GPU feature"
    return Plan("cpu", bf16, torch_compile, fused_adamw, tf32, off)


def plan(bf16: bool, torch_compile: bool, fused_adamw: bool, tf32: bool | None) -> Plan:
    """Keep each requested speed-up the hardware supports; give a reason for each one dropped."""
    import torch

    if torch.cuda.is_available():
        return gpu_plan(torch.cuda.get_device_capability(), torch.cuda.is_bf16_supported(including_emulation=False),
                        bf16, torch_compile, fused_adamw, tf32)
    return cpu_plan(bf16, torch_compile, fused_adamw, tf32)


def optimizer_name(speed: Plan) -> str:
    """The Trainer's `optim`: torch's fused AdamW (one kernel for all parameters) or the plain one."""
    return "adamw_torch_fused" if speed.fused_adamw else "adamw_torch"


def matmul_tf32(backends=None) -> bool:
    """Whether CUDA float32 matmuls run as TF32, read through the API that set it.

    transformers 5 turns TF32 on with `torch.backends.fp32_precision = "tf32"` on torch >= 2.9
    (`transformers/utils/import_utils.py`, `enable_tf32`). Once the new API is used, reading the legacy
    `torch.backends.cuda.matmul.allow_tf32` raises "mix of the legacy and new APIs", so it is read only
    on a torch that lacks the new one. The backend value resolves the global one (and a legacy write).
    `backends` is `torch.backends` unless a test passes a stand-in for an older torch.
    """
    if backends is None:
        import torch

        backends = torch.backends
    matmul = backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is None:  # torch < 2.9
        return bool(matmul.allow_tf32)
    if precision == "none":
        precision = getattr(backends, "fp32_precision", "none")
    return precision == "tf32"


def set_tf32(enabled: bool, backends=None) -> None:
    """Turn TF32 matmuls and convolutions on or off the way transformers does (never mixing the two APIs).

    Only the global switch, which every backend without a setting of its own follows, as `enable_tf32` does.
    """
    if backends is None:
        import torch

        backends = torch.backends
    if hasattr(backends, "fp32_precision"):
        backends.fp32_precision = "tf32" if enabled else "ieee"
    else:  # torch < 2.9
        backends.cuda.matmul.allow_tf32 = enabled
        backends.cudnn.allow_tf32 = enabled


def report(device: str) -> dict[str, object]:
    """What metrics.json records about the accelerator: its name and whether TF32 was in effect."""
    import torch

    if device != "cuda":
        return {"gpu": None, "tf32": None}
    return {"gpu": torch.cuda.get_device_name(0), "tf32": matmul_tf32()}


def check_launch(gpus: int, environ: dict[str, str]) -> str | None:
    """Why this launch must be refused, or None: several GPUs in one process make the Trainer use DataParallel."""
    if gpus > 1 and "LOCAL_RANK" not in environ:
        return (
            f"{gpus} GPUs are visible to a single process, which would run slow DataParallel; launch with "
            f"'torchrun --nproc_per_node=gpu -m training.train_sentiment ...' or limit CUDA_VISIBLE_DEVICES"
        )
    return None


# What torchrun sets for each process that makes accelerate treat it as one of a distributed group.
LAUNCH_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def lone_cpu_process(device: str, environ: dict[str, str]) -> tuple[str, ...]:
    """torchrun's variables to drop for a run of one process on a CPU, else nothing.

    accelerate 1.16 (`state.py` `_prepare_backend`, `accelerator.py` `prepare_model`) makes any torchrun process on a
    CPU "MULTI_CPU" and wraps its model in DistributedDataParallel, even alone; on a GPU it wraps only when there are
    several processes. DDP alone copies every gradient into its buckets and back at every step: work the single-GPU
    run does not do, which made the CPU benchmark's Trainer path slower than the bare loop for a reason of its own.
    """
    if device != "cpu" or environ.get("WORLD_SIZE", "1") != "1":
        return ()
    return tuple(name for name in LAUNCH_VARIABLES if name in environ)


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def batch_mean_loss(model) -> None:
    """Tell the Trainer that `model`'s loss is already a batch mean, so DDP must not rescale it.

    transformers 5.20's Trainer multiplies the loss by the number of processes when
    `average_tokens_across_devices` is on (its default) and the model "accepts loss kwargs", which it
    guesses from a `**kwargs` in `forward` unless the model sets `accepts_loss_kwargs`
    (`transformers/trainer.py`: `model_accepts_loss_kwargs` in `__init__`, `loss *= loss_scale` in
    `compute_loss`). That is right for causal-LM losses summed over `num_items_in_batch`, but a
    sequence classifier's cross-entropy is a mean already: with 8 processes loss and gradients were 8x.
    """
    model.accepts_loss_kwargs = False


def leave_process_group() -> None:
    """Every process of a distributed run leaves the process group together, then closes it: rank 0 writes the model
    and metrics after the others have finished, and no rank should exit while another still holds the group. A barrier
    first, then `destroy_process_group`, as PyTorch's distributed guide asks of every process at the end."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_process(status: int, environ: dict[str, str] | None = None) -> None:
    """End a torchrun worker of a group of several without Python's interpreter shutdown; return otherwise.

    A worker sometimes died of SIGABRT after its last line ("terminate called without an active exception"; in one of
    12 and one of 30 two-process runs on a 2-vCPU machine, and in two fresh-clone `make test` runs). The
    backtrace (a std::terminate handler preloaded into the worker): gloo's worker thread
    (`c10d::ProcessGroupGloo::runLoop`) dropped the last reference to a tensor after its work completed, which takes
    the GIL to free the tensor's Python object (`TensorImpl::decref_pyobject` -> `PyEval_AcquireThread`); the
    interpreter was already shutting down, so CPython ended that thread with `pthread_exit`, whose unwinding through a
    noexcept C++ frame calls std::terminate. The barrier and `destroy_process_group` above do not stop it: the thread
    finishes after the barrier's waiter wakes. Everything the worker writes is written by then, so it flushes its
    output and ends with `os._exit`, which runs no interpreter shutdown for a C++ thread to race.
    """
    import contextlib
    import logging
    import sys

    environ = os.environ if environ is None else environ
    if int(environ.get("WORLD_SIZE", "1")) <= 1:
        return
    for stream in [*(getattr(handler, "stream", None) for handler in logging.getLogger().handlers), sys.stdout,
                   sys.stderr]:
        with contextlib.suppress(AttributeError, ValueError, OSError):  # no stream, or one closed already
            stream.flush()
    os._exit(status)
