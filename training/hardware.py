"""What the current machine can do, so training and benchmark switch off only what it cannot."""

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


def plan(bf16: bool, torch_compile: bool, fused_adamw: bool, tf32: bool | None) -> Plan:
    """Keep each requested speed-up the hardware supports; give a reason for each one dropped."""
    import torch

    off: dict[str, str] = {}
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if bf16 and not torch.cuda.is_bf16_supported(including_emulation=False):
            bf16, off["bf16"] = False, f"GPU compute capability {major}.{minor} has no bf16"
        if tf32 and major < 8:
            tf32, off["tf32"] = False, "needs an Ampere or newer GPU"
        return Plan("cuda", bf16, torch_compile, fused_adamw, tf32, off)
    if bf16 and not cpu_has_bf16():
        bf16, off["bf16"] = False, "this CPU has no native bf16"
    if torch_compile and not has_compiler():
        torch_compile, off["torch_compile"] = False, "no C++ compiler for the CPU backend"
    if tf32:
        tf32, off["tf32"] = False, "a CUDA GPU feature"
    return Plan("cpu", bf16, torch_compile, fused_adamw, tf32, off)
