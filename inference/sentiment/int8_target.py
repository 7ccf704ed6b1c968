"""Which int8 weights the serving CPU needs: 8-bit, or 7-bit (`reduce_range`) only where its kernels saturate.

ONNX Runtime's dynamic int8 multiplies uint8 activations by int8 weights. On x86 without VNNI its kernel
(VPMADDUBSW) adds each pair of u8 x s8 products into a saturating int16, so full 8-bit weights can clip; 7-bit
weights keep the pair inside int16. With VNNI (VPDPBUSD, AVX512-VNNI or AVX-VNNI) the products accumulate in int32,
and on Arm the dot-product and matrix instructions (UDOT/SDOT, UMMLA/SMMLA on Graviton3's I8MM) do too: nothing
saturates, and 7-bit weights only throw away a bit of precision. ONNX Runtime's guidance says the same (onnxruntime
1.32.0, onnxruntime/quantization/quantize.py, quantize_static's "Choosing parameters for CPU inference": reduce_range
on x86 without VNNI). Measured here: the trained tiny model's int8 moved a probability by 0.0733 (FAIL) with 8-bit
weights on a Zen 2 (AVX2, no VNNI), by 0.0182 (PASS) with 7-bit.

The graph is made once, at packaging, usually on another machine than the one that serves it, so the packaging step
names the serving CPU: a SageMaker instance type (its family says which CPU), or `this-cpu` for a model served where
it is packaged (`make serve-local`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from inference.sentiment.cpu_features import CPUINFO

THIS_CPU = "this-cpu"
# settings/serving.py's default sentiment.instance_type (tests/inference/test_int8_target.py keeps them equal).
DEFAULT_TARGET = "ml.c7g.4xlarge"
X86_VNNI = ("avx512_vnni", "avx_vnni")
# An instance family: class letters, generation, then attributes (g: Graviton, i: Intel, a: AMD, d, n, e, ...).
FAMILY = re.compile(r"^(?P<kind>[a-z]+)(?P<generation>\d+)(?P<attributes>[a-z-]*)$")


@dataclass(frozen=True)
class Int8Target:
    """The int8 weights for one serving CPU, and why, in one phrase for the packaging log and export.json."""

    target: str  # an instance type or `this-cpu`
    reduce_range: bool  # True: 7-bit weights
    why: str

    @property
    def weight_bits(self) -> int:
        return 7 if self.reduce_range else 8


def for_instance_type(instance_type: str) -> Int8Target:
    """By the family's CPU: Graviton (a `g` after the generation: c6g, c7gn, m8g) and Intel from Ice Lake (6i) or
    AMD from Zen 4 (7a) have int32 dot products; older x86 families (c5 and m5 may land on Skylake, which has no VNNI;
    AMD 5a/6a are Zen 2/3) and any family not known here get 7-bit weights, which are safe everywhere."""
    parts = instance_type.split(".")
    match = FAMILY.match(parts[1]) if len(parts) == 3 and parts[0] == "ml" else None
    if match is None:
        raise ValueError(f"--serve-on {instance_type!r}: not a SageMaker instance type such as {DEFAULT_TARGET}, "
                         f"nor {THIS_CPU!r}")
    family, generation, attributes = parts[1], int(match["generation"]), match["attributes"]
    if attributes.startswith("g"):
        return Int8Target(instance_type, False, f"{family} is Graviton (Arm): int8 dot products accumulate in int32, "
                                                "8-bit weights")
    if (attributes.startswith("i") and generation >= 6) or (attributes.startswith("a") and generation >= 7):
        return Int8Target(instance_type, False, f"{family} is x86 with VNNI (int32 accumulation), 8-bit weights")
    return Int8Target(instance_type, True, f"{family} is x86 that may lack VNNI (its u8 x s8 kernel saturates), "
                                           "7-bit weights")


def for_cpuinfo(cpuinfo: str) -> Int8Target:
    """For the CPU whose /proc/cpuinfo text this is: Arm always 8-bit; x86 8-bit only where every processor has
    VNNI."""
    arm = [line for line in cpuinfo.splitlines() if line.partition(":")[0].strip().lower() == "features"]
    flags = [set(line.partition(":")[2].split()) for line in cpuinfo.splitlines()
             if line.partition(":")[0].strip().lower() == "flags"]
    if arm:
        return Int8Target(THIS_CPU, False, "this CPU is Arm: int8 dot products accumulate in int32, 8-bit weights")
    if flags and all(any(flag in processor for flag in X86_VNNI) for processor in flags):
        found = sorted(set.intersection(*flags) & set(X86_VNNI)) or list(X86_VNNI[:1])
        return Int8Target(THIS_CPU, False, f"this CPU has {' and '.join(found)} (int32 accumulation), 8-bit weights")
    return Int8Target(THIS_CPU, True, f"this CPU has no {' or '.join(X86_VNNI)} (its u8 x s8 kernel saturates), "
                                      "7-bit weights")


def resolve(target: str, cpuinfo_path: Path = CPUINFO) -> Int8Target:
    """`this-cpu` or an instance type; ValueError naming what is allowed otherwise."""
    if target == THIS_CPU:
        try:
            return for_cpuinfo(cpuinfo_path.read_text())
        except OSError as error:
            return Int8Target(THIS_CPU, True, f"{cpuinfo_path} unreadable ({error.strerror or error}), 7-bit weights "
                                              "(safe on any CPU)")
    return for_instance_type(target)
