"""Drop four library warnings that a user can do nothing about, and only those.

transformers imports torchao whenever it is installed (transformers/quantizers/quantizer_torchao.py, reached from
modeling_utils through quantizers/auto.py), so every process that loads a model imports it, int8 or not. With the
CPU torch wheel this project pins (torch==2.13.0+cpu) that import logs:

- `torchao`: "Failed to load .../torchao/_C_*.so": PyPI's torchao 0.18.0 wheel carries CUDA kernels (linked
  against libtorch_cuda and libc10_cuda), which a CPU build of torch can never load. torchao's CPU paths (the
  int8 dynamic quantization the accuracy gate measures) do not need them.
- `torchao.kernel.intmm`: "Detected no triton": Triton ships with CUDA builds of torch only.
- `torch.utils._pytree`: "<enum ...> is an Enum subclass ... register_constant() ... deprecated", for torchao's
  own enums (torchao/utils.py `register_as_pytree_constant`, on `KernelPreference` and `ScaleCalculationMode`).

And one from the Trainer, on any machine:

- `transformers.trainer_utils`: "mtime may not be reliable on this filesystem, falling back to numerical
  ordering": `sort_checkpoints` (transformers 5.20, trainer_utils.py) says so whenever the checkpoints it rotates
  were written less than a second apart, which a small model saving its best epoch does on any filesystem. The
  fallback, ordering by step number, is the right order for our checkpoints.

Each filter matches its one message, the first two only while torch has no CUDA (there a failed kernel load or a
missing Triton is something to fix), the third only for classes defined in torchao. Every other warning of these
libraries, and all of ours, still prints. `inference.sentiment` and `training` install the filters on import, so
every entry point that can load a model has them before transformers imports torchao.
"""

from __future__ import annotations

import logging
import sys


def _torch_without_cuda() -> bool:
    torch = sys.modules.get("torch")  # loaded by the time torchao logs: torchao imports torch first
    return torch is not None and getattr(torch.version, "cuda", None) is None


def _cuda_kernels_that_cannot_load(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return message.startswith("Failed to load ") and "torchao/_C" in message and _torch_without_cuda()


def _no_triton_on_cpu(record: logging.LogRecord) -> bool:
    return "Detected no triton" in record.getMessage() and _torch_without_cuda()


def _torchao_enum_registration(record: logging.LogRecord) -> bool:
    if not (isinstance(record.msg, str) and "is an Enum subclass" in record.msg and "register_constant" in record.msg):
        return False
    registered = record.args[0] if isinstance(record.args, tuple) and record.args else None
    return getattr(registered, "__module__", "").startswith("torchao.")


def _checkpoints_saved_within_a_second(record: logging.LogRecord) -> bool:
    return record.getMessage().startswith("mtime may not be reliable on this filesystem")


UNACTIONABLE = {
    "torchao": _cuda_kernels_that_cannot_load,
    "torchao.kernel.intmm": _no_triton_on_cpu,
    "torch.utils._pytree": _torchao_enum_registration,
    "transformers.trainer_utils": _checkpoints_saved_within_a_second,
}


class _Drop(logging.Filter):
    def __init__(self, logger_name: str) -> None:
        super().__init__()
        self.matches = UNACTIONABLE[logger_name]

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.matches(record)


def drop_unactionable_library_warnings() -> None:
    """Attach the filters (once) to the four loggers; they exist before the libraries create them."""
    for name in UNACTIONABLE:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, _Drop) for existing in logger.filters):
            logger.addFilter(_Drop(name))
