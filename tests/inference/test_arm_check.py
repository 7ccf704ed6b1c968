"""`make check-arm` (issue 44): what it reads from apt and from the emulated calibration, and what it refuses.

The emulation itself needs Debian's registries and minutes, so it runs as its own target, not here; these tests
check its logic on the real outputs it reads: apt's simulated-install lines, and records our calibration writes
(`--json`) for the tiny model's real graphs."""

from __future__ import annotations

import json
import shutil

import pytest

from inference.sentiment import arm_check, calibration, int8_target, onnx_engine, onnx_export
from inference.sentiment import precision as precisions
from inference.sentiment.cpu_features import Bf16Support

GRAVITON3 = Bf16Support(True, "aarch64: all 2 processors list bf16 in Features", "aarch64")
GRAVITON2 = Bf16Support(False, "aarch64: 2 of 2 processors list no bf16 in Features", "aarch64")
# Lines `apt-get -s install python3.13` printed for trixie's arm64 packages (the first run of `make check-arm`).
APT_SIMULATION = """NOTE: This is only a simulation!
Reading package lists...
Inst gcc-14-base (14.2.0-19 Debian:13.8/stable [arm64])
Inst libgcc-s1 (14.2.0-19 Debian:13.8/stable [arm64]) []
Inst libc6 (2.41-12+deb13u5 Debian:13.8/stable [arm64])
Conf libc6 (2.41-12+deb13u5 Debian:13.8/stable [arm64])
Inst tzdata (2026f-0+deb13u1 Debian:13.8/stable [all])
"""


@pytest.fixture(scope="module")
def graviton3_record(exported) -> dict:
    """What the calibration CLI writes on an aarch64 CPU with bf16, every pair run: here its record for this CPU's
    run with an aarch64 CPU given (ONNX Runtime ignores the fast-math option on x86), marked as aarch64's."""
    done = calibration.calibrate(exported, threads=1, cpu=GRAVITON3, budget_s=1e-6)
    return calibration.as_record(done) | {"machine": "aarch64", "cpu": GRAVITON3.evidence}


def test_apts_simulated_installs_are_read_with_their_versions_and_architectures():
    assert arm_check.simulated_installs(APT_SIMULATION) == [
        ("gcc-14-base", "14.2.0-19", "arm64"), ("libgcc-s1", "14.2.0-19", "arm64"),
        ("libc6", "2.41-12+deb13u5", "arm64"), ("tzdata", "2026f-0+deb13u1", "all")]


def test_the_apt_configuration_keeps_every_path_under_the_check_s_own_folder(tmp_path):
    config = arm_check.apt_config(tmp_path)
    paths = [line.split('"')[1] for line in config.splitlines() if line.startswith("Dir::")]
    assert len(paths) == 9 and all(path.startswith(str(tmp_path / "apt")) for path in paths)
    assert 'APT::Architecture "arm64";' in config
    assert arm_check.sources_list() == (f"deb [arch=arm64,amd64 signed-by={arm_check.KEYRING}] "
                                        "http://deb.debian.org/debian trixie main\n")


def test_the_calibration_cli_writes_its_record_with_the_machine_and_the_versions(exported, tmp_path, capsys):
    path = tmp_path / "calibration.json"
    assert calibration.main(["--model-dir", str(exported), "--threads", "1", "--precision", "onnx-int8",
                             "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["chosen"] == "onnx-int8" and record["line"] == capsys.readouterr().out.strip()
    assert record["machine"] == "x86_64" and record["cpu"].startswith("x86_64: ")
    assert set(record["versions"]) == {"python", "torch", "torch_cpu_capability", "onnxruntime"}
    assert [entry["precision"] for entry in record["figures"]] == ["fp32", "onnx-int8"]


def test_a_run_of_every_carried_pair_with_a_choice_and_8_bit_weights_for_c7g_passes(graviton3_record, exported):
    assert arm_check.carried_pairs(exported) == list(precisions.PRECISIONS)
    assert [entry["precision"] for entry in graviton3_record["figures"]] == list(precisions.PRECISIONS)
    assert arm_check.verify(graviton3_record, exported) == []


def test_a_pair_that_did_not_run_or_could_not_load_fails_the_check_by_name(graviton3_record, exported, model_dir):
    skipped = graviton3_record | {
        "figures": [entry for entry in graviton3_record["figures"] if entry["precision"] != "onnx-bf16-fastmath"],
        "skipped": {"onnx-bf16-fastmath": "the reason the calibration gave"}, "chosen": "fp32"}
    assert arm_check.verify(skipped, exported) == [
        "onnx-bf16-fastmath (ONNX Runtime fp32 graph, bf16 fast math (aarch64)) did not run: the reason the "
        "calibration gave"]
    broken = graviton3_record | {"chosen": "fp32", "figures": [
        entry | ({"error": "RuntimeError: no kernel"} if entry["precision"] == "int8" else {})
        for entry in graviton3_record["figures"]]}
    assert arm_check.verify(broken, exported) == ["int8 (torch int8 (torchao dynamic)) could not run: RuntimeError: "
                                                  "no kernel"]
    assert arm_check.verify(graviton3_record | {"machine": "x86_64", "chosen": None}, exported) == [
        "the calibration ran on 'x86_64', not aarch64", "no pair was chosen (chosen: None)"]
    assert arm_check.carried_pairs(model_dir) == ["fp32", "bf16", "int8"]  # no onnx/: torch's pairs only


def test_on_graviton2s_core_the_pairs_that_need_bf16_must_stay_out(graviton3_record, exported):
    done = calibration.calibrate(exported, threads=1, cpu=GRAVITON2, budget_s=1e-6)
    record = calibration.as_record(done) | {"machine": "aarch64", "cpu": GRAVITON2.evidence}
    assert set(record["skipped"]) == set(arm_check.NEEDS_BF16)
    assert arm_check.verify(record, exported, "neoverse-n1") == []
    assert arm_check.verify(graviton3_record, exported, "neoverse-n1") == [
        f"{name} ({precisions.label(name)}) ran on neoverse-n1, which has no bf16 instructions"
        for name in arm_check.NEEDS_BF16]


def test_an_archive_for_c7g_whose_int8_graph_has_7_bit_weights_fails_the_check(graviton3_record, exported, tmp_path):
    directory = tmp_path / "model"
    shutil.copytree(exported, directory)
    onnx_dir = directory / onnx_engine.ONNX_DIR
    graph = onnx_dir / onnx_engine.GRAPHS["onnx-int8"]
    onnx_export.quantize_int8(onnx_dir / onnx_engine.GRAPHS["onnx-fp32"], graph, tmp_path,
                              int8_target.for_instance_type("ml.c5.xlarge"))  # 7-bit weights, export.json unchanged
    [problem] = arm_check.verify(graviton3_record, directory)
    assert problem.startswith("the int8 graph is for 'ml.c7g.4xlarge', which needs 8-bit weights; export.json says "
                              "8, the graph's weights span -64..64 (7-bit)"), problem


def test_the_cli_names_a_missing_archive_and_a_missing_uv_before_downloading_anything(tmp_path, capsys):
    assert arm_check.main(["--model-dir", str(tmp_path / "none.tar.gz")]) == 2
    assert "--model-dir" in capsys.readouterr().err
    assert arm_check.main(["--model-dir", str(tmp_path), "--root", str(tmp_path / "arm"),
                           "--uv", str(tmp_path / "no-uv")]) == 2
    assert f"{tmp_path / 'no-uv'} not found: run `make install-dev` first" in capsys.readouterr().err
    assert not (tmp_path / "arm").exists()
