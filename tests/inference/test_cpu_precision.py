"""Precision for the serving CPU (issue 32): bf16 only where /proc/cpuinfo shows bf16 instructions, and the packaging
gate's record (which keeps accuracy apart from speed; the server chooses on its own CPU: test_calibration.py).

The /proc/cpuinfo texts are real: this machine's, read at test time, and one processor's block from Graviton
hosts as published (cited at each). Their verdicts must match the Graviton generations AWS documents: Graviton2
(Neoverse N1, CPU part 0xd0c; c6g, m6g, r6g) has no bf16, Graviton3 (Neoverse V1, 0xd40; c7g) has it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.sentiment import precision as precisions
from inference.sentiment.cpu_features import Bf16Support, bf16_support, this_cpu
from inference.sentiment.precision import Figures

# Graviton2: one processor of the /proc/cpuinfo posted from an AWS Graviton2 instance in archspec/archspec-json
# issue 41 ("Renaming AWS graviton2 target as neoverse-n1").
GRAVITON2 = """processor\t: 49
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""
# Graviton3: the Features a Graviton3 (m7g.2xlarge) reports, from Arm's PyTorch install guide
# (ArmDeveloperEcosystem/arm-learning-paths, content/install-guides/pytorch.md, commit 3cc8024d; shown there as
# lscpu's Flags, which lscpu reads from this line), in the processor block archspec/archspec-json pull request 51
# shows for a c7g (BogoMIPS 2100.00, CPU part 0xd40).
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop \
sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1
"""
# The c7g block as archspec/archspec-json pull request 51 printed it (`head -9 /proc/cpuinfo`, 2022): that kernel's
# Features line stops before the newer capabilities, bf16 among them. oneDNN reads the same kernel capabilities, so
# it would not use bf16 kernels there either: fp32 is the right answer.
GRAVITON3_OLD_KERNEL = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop \
sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1
"""


@pytest.mark.py313
def test_graviton2_has_no_bf16_and_graviton3_has():
    assert bf16_support(GRAVITON2) == Bf16Support(False, "aarch64: 1 of 1 processors list no bf16 in Features",
                                                  "aarch64")
    assert bf16_support(GRAVITON3) == Bf16Support(True, "aarch64: all 1 processors list bf16 in Features", "aarch64")
    assert not bf16_support(GRAVITON3_OLD_KERNEL).available
    # A mixed machine (one core without) is not a bf16 machine; neither is a text without feature lines.
    assert not bf16_support(GRAVITON3 + "\n" + GRAVITON2).available
    assert bf16_support("processor\t: 0\n") == Bf16Support(False, "no Features or flags lines in /proc/cpuinfo")


@pytest.mark.py313
def test_svebf16_alone_is_not_bf16():
    assert not bf16_support(GRAVITON2.replace(" ssbs\n", " ssbs svebf16\n")).available


@pytest.mark.py313
def test_x86_needs_avx512_bf16_or_amx_bf16_on_every_processor():
    text = Path("/proc/cpuinfo").read_text()
    flags = next(line for line in text.splitlines() if line.startswith("flags"))
    plain = flags.replace(" avx512_bf16", "").replace(" amx_bf16", "")
    block = f"processor\t: 0\n{plain}\n"
    assert bf16_support(block) == Bf16Support(
        False, "x86_64: 1 of 1 processors have neither avx512_bf16 nor amx_bf16", "x86_64")
    assert bf16_support(block.replace(plain, plain + " avx512_bf16")).evidence == \
        "x86_64: all 1 processors have avx512_bf16"
    assert bf16_support(block.replace(plain, plain + " amx_bf16 avx512_bf16")).available


def test_this_machines_verdict_is_onednns():
    """On this machine's real /proc/cpuinfo, the verdict agrees with what oneDNN itself detects (the x86 CPUs these
    tests run on differ: some have AVX512-BF16, some not; FACTS.md "CPU precision")."""
    import torch

    cpu = this_cpu()
    assert cpu.machine == "x86_64" or cpu.machine == "aarch64"
    assert cpu.available == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), cpu.evidence


# --- the packaging gate's record ----------------------------------------------------------------------------------

def write_record(directory: Path, figures: list[Figures], measured_on: dict | None = None) -> dict:
    record = precisions.make_record(figures, texts=114, **({"measured_on": measured_on} if measured_on else {}))
    (directory / precisions.RECORD).write_text(json.dumps(record))
    return record


def gate(bf16_ms=60.0, int8_ms=90.0, bf16_passes=True) -> list[Figures]:
    return [Figures("fp32", 1.0, 0.0, 240.0), Figures("bf16", 1.0 if bf16_passes else 0.9, 0.002, bf16_ms),
            Figures("int8", 1.0, 0.005, int8_ms)]


@pytest.mark.py313
def test_the_record_keeps_accuracy_apart_from_speed(tmp_path):
    """The packaging report and the model registry read it; what passed there and how fast, on which CPU."""
    record = write_record(tmp_path, gate(bf16_passes=False),
                          {"machine": "x86_64", "cpu": "AMD EPYC", "bf16_instructions": False})
    assert record["accuracy"] == {"passed": ["fp32", "int8"], "failed": ["bf16"]}
    assert record["speed"] == {"measured_on": {"machine": "x86_64", "cpu": "AMD EPYC", "bf16_instructions": False},
                               "ms_per_batch": {"fp32": 240.0, "bf16": 60.0, "int8": 90.0}}
    # Packaged on a machine without bf16, the record's own choice leaves bf16 out, as the server there would.
    passing = gate(bf16_ms=10.0)
    assert write_record(tmp_path, passing, {"machine": "x86_64", "bf16_instructions": False})["precision"] == "int8"
    assert write_record(tmp_path, passing, {"machine": "x86_64", "bf16_instructions": True})["precision"] == "bf16"


def test_the_settings_accept_graviton2_and_refuse_bf16_there():
    from settings import SettingsError, load_settings

    for instance_type in ("ml.c6g.4xlarge", "ml.m6g.2xlarge", "ml.r6g.xlarge"):
        config = load_settings("dev", {"sentiment.instance_type": instance_type}).sentiment
        assert config.precision is None  # the calibration chooses there (no bf16 pair on Graviton2)
        for needs_bf16 in ("bf16", "onnx-bf16-fastmath"):
            with pytest.raises(SettingsError) as refused:
                load_settings("dev", {"sentiment.instance_type": instance_type, "sentiment.precision": needs_bf16})
            message = str(refused.value)
            assert message.startswith(f"invalid setting sentiment.precision='{needs_bf16}': expected fp32, int8, "
                                      f"onnx-fp32 or onnx-int8 on {instance_type}"), message
        assert load_settings("dev", {"sentiment.instance_type": instance_type,
                                     "sentiment.precision": "int8"}).sentiment.precision == "int8"
    for needs_bf16 in ("bf16", "onnx-bf16-fastmath"):
        assert load_settings("dev", {"sentiment.instance_type": "ml.c7g.2xlarge",
                                     "sentiment.precision": needs_bf16}).sentiment.precision == needs_bf16
