"""Whether this CPU has bf16 instructions, read from /proc/cpuinfo (a pure function of its text, so it is tested on
real texts from other machines).

bf16 weights only pay where the CPU computes in bf16: oneDNN's bf16 kernels use AVX512-BF16 or AMX-BF16 on x86
and the BF16 instructions (FEAT_BF16) on Arm; without them it converts to fp32 and back, slower than fp32.

- aarch64: the kernel lists `bf16` in each processor's `Features` line when the CPU has FEAT_BF16 (Graviton3 and
  later: c7g, c8g; Graviton2, Neoverse N1, in c6g, m6g, r6g has none). oneDNN decides the same way from the
  kernel's hardware capabilities, so a kernel that does not report bf16 gets fp32 here too.
- x86_64: `avx512_bf16` or `amx_bf16` in each processor's `flags` line.

Every processor must have it (heterogeneous cores report their own lines).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
ARM_BF16 = ("bf16",)
X86_BF16 = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class Bf16Support:
    """Whether every processor has bf16 instructions, and the evidence in one phrase for the start-up log."""

    available: bool
    evidence: str
    machine: str = "unknown"  # aarch64 or x86_64, as the text's kind of feature lines says


def _feature_lines(cpuinfo: str) -> tuple[list[set[str]], list[set[str]]]:
    """(aarch64 `Features` sets, x86 `flags` sets), one per processor."""
    arm, x86 = [], []
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "features":
            arm.append(set(value.split()))
        elif key == "flags":
            x86.append(set(value.split()))
    return arm, x86


def bf16_support(cpuinfo: str) -> Bf16Support:
    """Bf16Support from the text of /proc/cpuinfo."""
    arm, x86 = _feature_lines(cpuinfo)
    if arm:
        lacking = sum(not any(flag in features for flag in ARM_BF16) for features in arm)
        if lacking:
            return Bf16Support(False, f"aarch64: {lacking} of {len(arm)} processors list no bf16 in Features",
                               "aarch64")
        return Bf16Support(True, f"aarch64: all {len(arm)} processors list bf16 in Features", "aarch64")
    if x86:
        lacking = sum(not any(flag in flags for flag in X86_BF16) for flags in x86)
        if lacking:
            return Bf16Support(False, f"x86_64: {lacking} of {len(x86)} processors have neither "
                                      f"{' nor '.join(X86_BF16)}", "x86_64")
        found = sorted(set.intersection(*x86) & set(X86_BF16))
        return Bf16Support(True, f"x86_64: all {len(x86)} processors have {' and '.join(found)}", "x86_64")
    return Bf16Support(False, "no Features or flags lines in /proc/cpuinfo")


def this_cpu(path: Path = CPUINFO) -> Bf16Support:
    """This machine's Bf16Support (none where /proc/cpuinfo cannot be read)."""
    try:
        return bf16_support(path.read_text())
    except OSError as error:
        return Bf16Support(False, f"{path} unreadable ({error.strerror or error})")
