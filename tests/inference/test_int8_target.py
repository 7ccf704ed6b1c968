"""int8 weights made for the serving CPU (issue 44): 8-bit where its int8 kernel accumulates in int32 (Graviton, x86
with VNNI), 7-bit only where it saturates (x86 without VNNI). What ONNX Runtime's quantizer then writes is checked in
tests/inference/test_onnx_engine.py; here, which CPU an instance type or a /proc/cpuinfo text means."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.sentiment import int8_target
from inference.sentiment.int8_target import THIS_CPU, for_cpuinfo, for_instance_type
from tests.inference.test_cpu_precision import GRAVITON2, GRAVITON3


@pytest.mark.parametrize("instance_type", ["ml.c7g.4xlarge", "ml.c6g.large", "ml.m6g.xlarge", "ml.c7gn.2xlarge",
                                           "ml.r8g.large", "ml.c6gd.xlarge"])
def test_graviton_families_get_8_bit_weights(instance_type):
    target = for_instance_type(instance_type)
    assert (target.weight_bits, target.target) == (8, instance_type)
    assert "Graviton" in target.why


@pytest.mark.parametrize(("instance_type", "bits"), [
    ("ml.c6i.xlarge", 8), ("ml.m7i.2xlarge", 8), ("ml.m7i-flex.large", 8), ("ml.c7a.xlarge", 8),  # VNNI
    ("ml.c5.xlarge", 7), ("ml.m5.large", 7), ("ml.c5n.xlarge", 7), ("ml.t2.medium", 7),  # may be Skylake or older
    ("ml.c6a.xlarge", 7), ("ml.m5a.large", 7), ("ml.g5.xlarge", 7),  # AMD Zen 2 and Zen 3: AVX2 only
])
def test_x86_families_get_7_bit_weights_unless_they_have_vnni(instance_type, bits):
    assert for_instance_type(instance_type).weight_bits == bits


@pytest.mark.parametrize("wrong", ["c7g.4xlarge", "ml.c7g", "ml..xlarge", "graviton", "ml.c7g.4xlarge.extra"])
def test_a_wrong_target_names_itself_and_what_is_allowed(wrong):
    with pytest.raises(ValueError, match=r"--serve-on .*not a SageMaker instance type such as ml\.c7g\.4xlarge, nor "
                                         r"'this-cpu'") as raised:
        int8_target.resolve(wrong)
    assert repr(wrong) in str(raised.value)


def test_arm_cpus_get_8_bit_weights_with_or_without_bf16():
    for text in (GRAVITON2, GRAVITON3):
        target = for_cpuinfo(text)
        assert (target.target, target.weight_bits) == (THIS_CPU, 8) and "Arm" in target.why


def test_x86_gets_8_bit_weights_only_where_every_processor_has_vnni():
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    plain = flags.replace(" avx512_vnni", "").replace(" avx_vnni", "")
    without, with_vnni = f"processor\t: 0\n{plain}\n", f"processor\t: 0\n{plain} avx_vnni\n"
    assert for_cpuinfo(without).weight_bits == 7 and "no avx512_vnni or avx_vnni" in for_cpuinfo(without).why
    assert for_cpuinfo(with_vnni).weight_bits == 8 and "avx_vnni" in for_cpuinfo(with_vnni).why
    assert for_cpuinfo(with_vnni + "\n" + without).weight_bits == 7  # one processor without: the kernel may saturate


def test_an_unreadable_cpuinfo_gets_the_weights_safe_everywhere(tmp_path):
    target = int8_target.resolve(THIS_CPU, cpuinfo_path=tmp_path / "missing")
    assert target.weight_bits == 7 and "unreadable" in target.why


def test_the_default_target_is_the_endpoints_default_instance_type():
    from settings.serving import SentimentSettings

    assert SentimentSettings().instance_type == int8_target.DEFAULT_TARGET
