"""The start-up calibration on Arm kernels, run on this x86 machine under QEMU's emulated Graviton3 core.

The tiny model's archive for ml.c7g is calibrated on an emulated Neoverse V1 (Graviton3: SVE 256-bit, BF16, I8MM)
with the serving image's aarch64 wheels.

Every pair the archive carries runs on the aarch64 builds of torch (oneDNN with Arm Compute Library) and ONNX
Runtime (MLAS's NEON, SVE, I8MM and BF16 kernels), and is checked for accuracy against torch fp32 on those kernels,
as the endpoint does at start. Timings under emulation mean nothing and are not used: the run keeps the
calibration's timing to one round and reports its choice only to show that a pair is chosen and loaded.

What it builds under build/arm/ (once; a later run reuses it):
- Debian 13 (trixie) for arm64: CPython 3.13 (the image's Python) and its libraries, unpacked into a folder (no
  container, nothing installed on this machine);
- QEMU's aarch64 user-mode emulator from the same release (10.0, a static binary): it emulates /proc/cpuinfo and
  the hardware capabilities of the CPU model it runs, so torch, ONNX Runtime and our `cpu_features` see a
  Neoverse V1. (Debian 12's QEMU 7.2 does neither: torch's cpuinfo then reads this machine's x86 /proc/cpuinfo,
  and ONNX Runtime crashes at import; its SVE also gave int8 results that QEMU 10 and the NEON kernels do not.)
- The aarch64 wheels: everything of the image's lock (inference/sentiment/image/requirements.lock, the same files
  by hash, ONNX Runtime 1.32.0 included), and torch from `ARM_TORCH_LOCK` (why not the image's torch: there).

Needs Debian's apt (any Debian or Ubuntu machine, as root or with write access to build/), an x86_64 host, and the
package registries (deb.debian.org, PyPI): about 260 MB of downloads the first time.

    make check-arm                           # train-local's archive (packaged for ml.c7g.4xlarge), or MODEL=...
    make check-arm ARGS="--cpu neoverse-n1"  # on Graviton2's core: no bf16, so its pairs must stay out

Exit status: 0 when every pair the archive carries ran on Arm kernels, one was chosen, and its int8 graph has the
weights its target needs; 1 when not (the reasons are printed); 2 when the emulator could not be set up here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inference.sentiment import int8_target, onnx_engine
from inference.sentiment import precision as precisions

PROG = "python -m inference.sentiment.arm_check"
REPO = Path(__file__).resolve().parents[2]
IMAGE_DIR = Path(__file__).resolve().parent / "image"
IMAGE_LOCK = IMAGE_DIR / "requirements.lock"
ARM_TORCH_LOCK = IMAGE_DIR / "arm-check-torch.lock"
DEFAULT_ROOT = REPO / "build" / "arm"
DEFAULT_MODEL = REPO / "artifacts" / "tiny-model.tar.gz"
# Debian 13: CPython 3.13 like the image's base, and QEMU 10 (see the module docstring for why not Debian 12's).
SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
PYTHON_PACKAGES = ("python3.13", "libstdc++6", "libgomp1")  # and what they depend on
QEMU_PACKAGE = "qemu-user"  # Debian 13 builds its user-mode emulators statically
QEMU_BINARY = "usr/bin/qemu-aarch64"
# QEMU's models of the Graviton cores the settings allow: Graviton3 (c7g, the default sentiment.instance_type's
# family; SVE 256-bit, BF16, I8MM) and Graviton2 (c6g; dot products, no bf16: bf16 pairs must not run there).
CPU_MODELS = {"neoverse-v1": ("Graviton3's core, c7g", True), "neoverse-n1": ("Graviton2's core, c6g", False)}
DEFAULT_CPU_MODEL = "neoverse-v1"
# The pairs that need bf16 instructions: the calibration must leave them out on a CPU without them.
NEEDS_BF16 = ("bf16", "onnx-bf16-fastmath")
INST = re.compile(r"^Inst (\S+) \((\S+) [^\[]*\[([\w-]+)\]\)", re.MULTILINE)
WHEEL_PLATFORM = ("--python-platform", "aarch64-manylinux_2_28", "--python-version", "3.13")

Progress = Callable[[str], None]


class SetupError(RuntimeError):
    """The emulator or its Python could not be set up here (exit 2)."""


@dataclass(frozen=True)
class Emulator:
    """What `prepare` built: the emulator, the arm64 system folder and the aarch64 packages."""

    qemu: Path
    sysroot: Path
    site: Path
    versions: dict

    @property
    def python(self) -> Path:
        return self.sysroot / "usr" / "bin" / "python3.13"


def apt_config(root: Path) -> str:
    """An apt configuration that touches nothing of this machine's: its own sources (trixie, arm64 and amd64), lists,
    cache and an empty dpkg status, so dependencies resolve as on an empty arm64 system."""
    apt = root / "apt"
    return "\n".join([
        'APT::Architecture "arm64";',
        'APT::Architectures { "arm64"; "amd64"; };',
        f'Dir::Etc::SourceList "{apt}/sources.list";',
        f'Dir::Etc::SourceParts "{apt}/sources.list.d";',
        f'Dir::Etc::Parts "{apt}/apt.conf.d";',
        f'Dir::Etc::Preferences "{apt}/preferences";',
        f'Dir::Etc::PreferencesParts "{apt}/preferences.d";',
        f'Dir::State "{apt}/state";',
        f'Dir::State::Lists "{apt}/lists";',
        f'Dir::State::status "{apt}/status";',
        f'Dir::Cache "{apt}/cache";',
        'Acquire::Languages "none";',
        # apt drops to its _apt user to download; that user may not write into a checkout.
        'APT::Sandbox::User "root";',
        "",
    ])


def sources_list() -> str:
    return f"deb [arch=arm64,amd64 signed-by={KEYRING}] {MIRROR} {SUITE} main\n"


def simulated_installs(text: str) -> list[tuple[str, str, str]]:
    """(package, version, architecture) from `apt-get install -s` output: its `Inst` lines, e.g.
    `Inst libgcc-s1 (14.2.0-19 Debian:13.8/stable [arm64]) []`."""
    return [match.groups() for match in INST.finditer(text)]


def prepare(root: Path, *, uv: Path, progress: Progress) -> Emulator:
    """Build (or reuse) the emulator, the arm64 system folder and the aarch64 wheels under `root`."""
    if not Path(uv).is_file():
        raise SetupError(f"{uv} not found: run `make install-dev` first (it installs uv)")
    if platform.machine() != "x86_64":
        raise SetupError(f"this check emulates aarch64 on x86_64; this machine is {platform.machine()} (on an "
                         "aarch64 machine run `python -m inference.sentiment.calibration --model-dir ...` natively)")
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise SetupError(f"{tool} not found: this check takes Python and QEMU from Debian's packages (a Debian "
                             "or Ubuntu machine)")
    if not KEYRING.is_file():
        raise SetupError(f"{KEYRING} not found: install Debian's debian-archive-keyring package")
    root.mkdir(parents=True, exist_ok=True)
    stamp = root / "prepared.json"
    wanted = {"suite": SUITE, "packages": list(PYTHON_PACKAGES), "locks": _digest(IMAGE_LOCK, ARM_TORCH_LOCK)}
    if stamp.is_file():
        done = json.loads(stamp.read_text())
        if done.get("wanted") == wanted:
            progress(f"arm check: reusing {root.relative_to(REPO) if root.is_relative_to(REPO) else root}")
            return _emulator(root, done["versions"])
    sysroot, site = root / "sysroot", root / "site"
    for folder in (sysroot, site, root / "apt"):
        shutil.rmtree(folder, ignore_errors=True)
    env = _apt_environment(root)
    progress(f"arm check: Debian {SUITE} package lists (arm64, amd64) ...")
    _run(["apt-get", "-q", "update"], env=env)
    installs = simulated_installs(_run(["apt-get", "-s", "--no-install-recommends", "install",
                                        *PYTHON_PACKAGES], env=env))
    if not any(name == "python3.13" for name, _, _ in installs):
        raise SetupError(f"apt did not resolve python3.13 for arm64 from {SUITE}")
    downloads = root / "apt" / "debs"
    downloads.mkdir(parents=True)
    progress(f"arm check: downloading CPython 3.13 for arm64 ({len(installs)} packages) and {QEMU_PACKAGE} (amd64) "
             "...")
    _run(["apt-get", "-q", "download", *[f"{name}:{arch}" for name, _, arch in installs], f"{QEMU_PACKAGE}:amd64"],
         env=env, cwd=downloads)
    sysroot.mkdir()
    for deb in sorted(downloads.glob("*_arm64.deb")) + sorted(downloads.glob("*_all.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(sysroot)])
    for merged in ("lib", "bin", "sbin"):  # Debian 13 is merged-/usr: base-files makes these links
        link = sysroot / merged
        if not link.exists():
            link.symlink_to(f"usr/{merged}")
    [qemu_deb] = downloads.glob(f"{QEMU_PACKAGE}_*_amd64.deb")
    _extract_member(qemu_deb, QEMU_BINARY, root / "qemu-aarch64")
    versions = {"debian": {name: version for name, version, _ in installs}}
    versions["debian"][QEMU_PACKAGE] = _deb_version(qemu_deb)
    progress("arm check: the image's aarch64 wheels (requirements.lock by hash, torch from "
             f"{ARM_TORCH_LOCK.name}) ...")
    for lock in (IMAGE_LOCK, ARM_TORCH_LOCK):
        _run([str(uv), "pip", "install", "--quiet", "--no-deps", "--require-hashes", "--target", str(site),
              *WHEEL_PLATFORM, "-r", str(lock)])
    shutil.rmtree(downloads)
    stamp.write_text(json.dumps({"wanted": wanted, "versions": versions}, indent=1) + "\n")
    return _emulator(root, versions)


def emulated_command(emulator: Emulator, argv: list[str], cpu_model: str = DEFAULT_CPU_MODEL) -> list[str]:
    """`python3.13 argv...` on the emulated core, with the aarch64 wheels and this checkout on its path."""
    return [str(emulator.qemu), "-cpu", cpu_model, "-L", str(emulator.sysroot),
            # Python writes its bytecode caches under emulation once; later runs import several times faster.
            "-U", "PYTHONDONTWRITEBYTECODE",
            "-E", f"PYTHONPATH={emulator.site}{os.pathsep}{REPO}",
            "-E", "HF_HUB_OFFLINE=1", "-E", "TRANSFORMERS_NO_ADVISORY_WARNINGS=1",
            str(emulator.python), *argv]


def calibrate(emulator: Emulator, archive: Path, workdir: Path, *, cpu_model: str = DEFAULT_CPU_MODEL,
              progress: Progress) -> tuple[dict, Path]:
    """Run the calibration CLI under emulation; (its JSON record, the emulated process's full log)."""
    record_path, log_path = workdir / "calibration.json", workdir / "calibration.log"
    # Budget 1 s: the race stops after its first timed round, which is all a choice needs here (the timings of an
    # emulated CPU mean nothing).
    command = emulated_command(emulator, ["-m", "inference.sentiment.calibration", "--model-dir", str(archive),
                                          "--budget", "1", "--json", str(record_path)], cpu_model)
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in process.stdout:
            log.write(line)
            if line.startswith("calibration: ") and "serving " not in line:
                progress(f"  (aarch64) {line.rstrip()}")
        returncode = process.wait()
    if returncode != 0 or not record_path.is_file():
        tail = log_path.read_text().strip().splitlines()[-15:]
        raise CheckFailed([f"the calibration under emulation exited with {returncode}; the end of its log "
                           f"({log_path}):", *[f"    {line}" for line in tail]])
    return json.loads(record_path.read_text()), log_path


class CheckFailed(Exception):
    def __init__(self, reasons: list[str]):
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def carried_pairs(model_dir: Path) -> list[str]:
    """The pairs an archive carries: torch's always; ONNX Runtime's where its graph is in `onnx/`."""
    return [name for name in precisions.PRECISIONS
            if name not in precisions.ONNX_PRECISIONS or onnx_engine.graph_path(model_dir, name).is_file()]


def verify(record: dict, model_dir: Path, cpu_model: str = DEFAULT_CPU_MODEL) -> list[str]:
    """Why the emulated calibration does not show what it must (empty when it does): every pair the archive carries
    ran on Arm kernels (those that need bf16 only where the core has it, and never where it has not), one was
    chosen, and the int8 graph has the weights its target needs, read from the graph itself."""
    problems = []
    if record.get("machine") != "aarch64":
        problems.append(f"the calibration ran on {record.get('machine')!r}, not aarch64")
    figures = {entry["precision"]: entry for entry in record.get("figures", [])}
    has_bf16 = CPU_MODELS[cpu_model][1]
    for name in carried_pairs(model_dir):
        if name in NEEDS_BF16 and not has_bf16:
            if name in figures:
                problems.append(f"{name} ({precisions.label(name)}) ran on {cpu_model}, which has no bf16 "
                                "instructions")
            continue
        if name not in figures:
            why = record.get("skipped", {}).get(name, "not measured")
            problems.append(f"{name} ({precisions.label(name)}) did not run: {why}")
        elif figures[name].get("error"):
            problems.append(f"{name} ({precisions.label(name)}) could not run: {figures[name]['error']}")
    if record.get("chosen") not in figures:
        problems.append(f"no pair was chosen (chosen: {record.get('chosen')!r})")
    weights = int8_weights(model_dir)
    if weights is not None:
        made, low, high, bits = weights
        target = int8_target.resolve(made.get("target", ""))
        if made.get("weight_bits") != target.weight_bits or bits != target.weight_bits:
            problems.append(f"the int8 graph is for {made.get('target')!r}, which needs {target.weight_bits}-bit "
                            f"weights; export.json says {made.get('weight_bits')}, the graph's weights span "
                            f"{low}..{high} ({bits}-bit)")
    return problems


def int8_weights(model_dir: Path) -> tuple[dict, int, int, int] | None:
    """The int8 graph's export record (`export.json`'s "int8"), its weights' smallest and largest value, read from
    the graph, and the bits they span (8-bit weights reach +-127, 7-bit ones stop at +-64); None without the graph."""
    from inference.sentiment.onnx_export import int8_weight_range

    graph = onnx_engine.graph_path(model_dir, "onnx-int8")
    if not graph.is_file():
        return None
    made = (onnx_engine.read_manifest(Path(model_dir) / onnx_engine.ONNX_DIR) or {}).get("int8") or {}
    low, high = int8_weight_range(graph)
    return made, low, high, 8 if max(abs(low), abs(high)) > 64 else 7


def report(record: dict, model_dir: Path, emulator: Emulator, archive: Path, log: Path,
           cpu_model: str = DEFAULT_CPU_MODEL) -> list[str]:
    versions = record.get("versions", {})
    lines = [f"arm check: {archive} under QEMU {emulator.versions['debian'].get(QEMU_PACKAGE)} -cpu {cpu_model} "
             f"({CPU_MODELS[cpu_model][0]}), CPython {versions.get('python')}, torch {versions.get('torch')} "
             f"(capability {versions.get('torch_cpu_capability')}), onnxruntime {versions.get('onnxruntime')}",
             f"  CPU as the emulated process reads it: {record.get('cpu')}"]
    for entry in record.get("figures", []):
        name = entry["precision"]
        if entry.get("error"):
            lines.append(f"  {name:<19} cannot run ({entry['error']})")
            continue
        verdict = "PASS" if precisions.Figures.from_dict(name, entry).passed() else "FAIL"
        lines.append(f"  {name:<19} {verdict}: labels agree {entry['agreement']:.1%}, max probability change "
                     f"{entry['max_change']:.4f}  ({precisions.label(name)})")
    for name, why in record.get("skipped", {}).items():
        lines.append(f"  {name:<19} not run: {why}")
    weights = int8_weights(model_dir)
    if weights is not None:
        made, low, high, _ = weights
        lines.append(f"  int8 graph: weights {low}..{high} ({made.get('weight_bits')}-bit, made for "
                     f"{made.get('target')})")
    lines.append(f"  chosen: {record.get('chosen')} (under emulation: its timings mean nothing, the choice shows only "
                 f"that the calibration chooses and loads a pair on Arm kernels); full log: {log}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL,
                        help="a model.tar.gz (or its folder) from training.package")
    parser.add_argument("--cpu", choices=CPU_MODELS, default=DEFAULT_CPU_MODEL,
                        help="QEMU's CPU model: " + "; ".join(f"{name}: {what}" for name, (what, _) in
                                                              CPU_MODELS.items()))
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="where the emulator and its Python live")
    parser.add_argument("--uv", type=Path, default=REPO / "build" / "uv" / "bin" / "uv",
                        help="the uv that installs the aarch64 wheels (make install-dev's)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    if not args.model_dir.exists():
        print(f"{PROG}: error: --model-dir {args.model_dir}: not found (make train-local packages the tiny model's "
              "archive)", file=sys.stderr)
        return 2
    try:
        emulator = prepare(args.root, uv=args.uv, progress=say)
    except (SetupError, subprocess.CalledProcessError) as error:
        print(f"{PROG}: cannot set up the emulator: {_describe(error)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="arm-check-") as scratch:
        model_dir = Path(args.model_dir)
        if model_dir.is_file():
            with tarfile.open(model_dir, "r:gz") as archive:
                archive.extractall(Path(scratch) / "model", filter="data")
            model_dir = Path(scratch) / "model"
        say(f"arm check: calibrating {args.model_dir} on the emulated {args.cpu} (a few minutes: emulation is slow)")
        try:
            record, log = calibrate(emulator, model_dir, args.root, cpu_model=args.cpu, progress=say)
        except CheckFailed as failed:
            print("\n".join(failed.reasons), file=sys.stderr)
            return 1
        for line in report(record, model_dir, emulator, args.model_dir, log, args.cpu):
            say(line)
        problems = verify(record, model_dir, args.cpu)
    if problems:
        print("arm check: FAILED\n" + "\n".join(f"  {problem}" for problem in problems), file=sys.stderr)
        return 1
    say(f"arm check: passed: every pair {args.model_dir} carries that {args.cpu} runs ran on Arm kernels, and one "
        "was chosen")
    return 0


def _emulator(root: Path, versions: dict) -> Emulator:
    return Emulator(qemu=root / "qemu-aarch64", sysroot=root / "sysroot", site=root / "site", versions=versions)


def _apt_environment(root: Path) -> dict[str, str]:
    apt = root / "apt"
    for folder in ("lists/partial", "cache/archives/partial", "state", "sources.list.d", "apt.conf.d",
                   "preferences.d"):
        (apt / folder).mkdir(parents=True, exist_ok=True)
    (apt / "status").touch()
    (apt / "sources.list").write_text(sources_list())
    (apt / "apt.conf").write_text(apt_config(root))
    return {**os.environ, "APT_CONFIG": str(apt / "apt.conf"), "DEBIAN_FRONTEND": "noninteractive"}


def _run(command: list[str], *, env: dict | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"{' '.join(command[:4])} ... exited with {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()[-600:]}")
    return done.stdout


def _extract_member(deb: Path, member: str, target: Path) -> None:
    """One file of a .deb, streamed, without unpacking the rest (qemu-user carries every architecture's emulator,
    about 465 MB unpacked)."""
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as unpack:
        with tarfile.open(fileobj=unpack.stdout, mode="r|") as archive:
            for entry in archive:
                if entry.name == f"./{member}" and entry.isfile():
                    target.write_bytes(archive.extractfile(entry).read())
                    break
            else:
                raise SetupError(f"{deb.name} has no {member}")
        unpack.stdout.close()
    target.chmod(0o755)


def _deb_version(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _digest(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _describe(error: BaseException) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        return f"{' '.join(map(str, error.cmd[:3]))} ... exited with {error.returncode}"
    return str(error)


if __name__ == "__main__":
    sys.exit(main())
