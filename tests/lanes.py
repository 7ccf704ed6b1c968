"""Run the test suite as three concurrent pytest processes ("lanes"), so `make test` keeps a 2-core CI busy.

    python tests/lanes.py                 # what `make test` runs
    python tests/lanes.py -- -k settings  # arguments after -- go to every lane's pytest
    python tests/lanes.py --serial        # one pytest process, as before

Lane `torchserve` runs the tests marked `torchserve` (they start TorchServe, and the SageMaker toolkit allows one per
machine, so they stay in one process, one after another); lane `servers` those marked `servers` (they start servers
or tools and mostly wait on them); lane `rest` everything else. The first two wait on JVMs, sockets and signals more
than they compute, which is why three fit on two cores (figures in docs/figures.md, "Test suite"). Each lane
writes its output to a log, printed whole when the lane ends; meanwhile a progress line every `--progress` seconds.

SIGTERM or SIGINT (Ctrl-C) sends each running lane one SIGINT, so pytest tears its fixtures down and stops the
servers they started; then the exit status is 0 after SIGTERM, 130 after SIGINT. Otherwise it is 0 when every lane
passed, else the first failing lane's pytest status (1 failed tests, 2 interrupted, ...). A lane that selects no
test (pytest's 5) counts as passed unless no lane ran anything.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Lane -> marker expression; every test is in exactly one lane (`lane_of`).
LANES = {"torchserve": "torchserve", "servers": "servers and not torchserve", "rest": "not (torchserve or servers)"}
# Where a lane collects when no path is given (pytest's testpaths): collecting the whole tree costs a lane 4 s of
# imports. tests/conftest.py refuses a test whose markers put it in a lane that does not collect its folder.
LANE_TESTPATHS = {"torchserve": ("tests/inference",),
                  "servers": ("tests/inference", "tests/loadtest", "tests/falcon_benchmark")}

NO_TESTS = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
PERCENT = re.compile(rb"\[\s*(\d+)%\]")
STOP_GRACE_S = 120  # for a lane's teardown after SIGINT: stopping a TorchServe takes about 5 s


def lane_of(markers: set[str]) -> str:
    """The lane a test with these marker names runs in, by the same rules as the marker expressions in LANES."""
    return "torchserve" if "torchserve" in markers else "servers" if "servers" in markers else "rest"


@dataclass
class Lane:
    name: str
    process: subprocess.Popen
    log: Path
    started: float
    ended: float | None = None

    def progress(self) -> str:
        """The last `[ NN%]` pytest printed, or what the lane is doing before its first one."""
        if self.ended is not None:
            return f"done in {self.ended - self.started:.0f} s (exit {self.process.returncode})"
        found = PERCENT.findall(self.log.read_bytes()) if self.log.exists() else []
        return f"{int(found[-1])}%" if found else "collecting"


def _seconds(text: str) -> float:
    if not re.fullmatch(r"\d+(\.\d+)?", text) or float(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text!r}")
    return float(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python tests/lanes.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serial", action="store_true", help="one pytest process with the arguments as given")
    parser.add_argument("--progress", type=_seconds, default=30.0, metavar="SECONDS",
                        help="seconds between progress lines (default 30)")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to every lane's pytest")
    return parser


def lane_environment() -> dict[str, str]:
    """Lanes share the cores: OpenMP threads that spin-wait after each parallel region (libgomp's default) would
    burn the other lane's CPU, so they sleep instead unless the caller chose otherwise."""
    return {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}


def start(name: str, marker: str, pytest_args: list[str], workdir: Path) -> Lane:
    log = workdir / f"{name}.log"
    testpaths = ["-o", "testpaths=" + " ".join(LANE_TESTPATHS[name])] if name in LANE_TESTPATHS else []
    command = [sys.executable, "-m", "pytest", *testpaths, "-m", marker, f"--basetemp={workdir / name}",
               "-o", f"cache_dir={Path('.pytest_cache') / ('lane-' + name)}", *pytest_args]
    with log.open("wb") as out:
        # A session of its own: a signal to our group reaches the lanes only as the one SIGINT `stop` sends.
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=lane_environment(),
                                   start_new_session=True)
    return Lane(name, process, log, time.monotonic())


def stop(lanes: list[Lane]) -> None:
    """SIGINT to every running lane, so pytest tears its fixtures down (servers included), then whatever is left."""
    from common import processes

    running = [lane for lane in lanes if processes.poll(lane.process) is None]
    for lane in running:
        lane.process.send_signal(signal.SIGINT)
    for lane in running:
        try:
            processes.wait(lane.process, timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            processes.stop_tree(lane.process, grace=10)
        print(f"lanes: {lane.name} stopped (exit {lane.process.returncode}); the end of its output:", file=sys.stderr)
        sys.stderr.buffer.write(b"\n".join(lane.log.read_bytes().splitlines()[-20:]) + b"\n")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.serial:
        return subprocess.call([sys.executable, "-m", "pytest", *args.pytest_args])
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository's packages
    from common import processes

    processes.install_stop_handlers()  # SIGTERM or SIGINT: the lanes are stopped, exit 0 or 130 (issue 24's rule)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: where a run that seems stuck is
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="test-lanes-") as temporary:
        workdir = Path(temporary)
        lanes: list[Lane] = []
        try:
            for name, marker in LANES.items():
                lanes.append(start(name, marker, args.pytest_args, workdir))
            print(f"lanes: {', '.join(f'{lane.name} (-m {LANES[lane.name]!r})' for lane in lanes)}; output of each "
                  "when it ends", flush=True)
            next_report = time.monotonic() + args.progress
            while any(lane.ended is None for lane in lanes):
                time.sleep(0.2)
                for lane in lanes:
                    if lane.ended is None and processes.poll(lane.process) is not None:
                        lane.ended = time.monotonic()
                        print(f"\n===== lane {lane.name}: exit {lane.process.returncode} after "
                              f"{lane.ended - lane.started:.0f} s =====", flush=True)
                        sys.stdout.buffer.write(lane.log.read_bytes())
                        sys.stdout.flush()
                if time.monotonic() >= next_report and any(lane.ended is None for lane in lanes):
                    print(f"[{time.monotonic() - started:.0f} s] "
                          + "; ".join(f"{lane.name}: {lane.progress()}" for lane in lanes), flush=True)
                    next_report += args.progress
        except processes.Stopped:
            with processes.shielded():
                stop(lanes)
            print(f"lanes: stopped by {signal.Signals(processes.received()).name}", file=sys.stderr)
            processes.finish(processes.exit_status(processes.received()))
    statuses = [lane.process.returncode for lane in lanes]
    print(f"\nlanes: pytest took {time.monotonic() - started:.0f} s wall time; "
          + "; ".join(f"{lane.name} {lane.progress()}" for lane in lanes), flush=True)
    if all(status == NO_TESTS for status in statuses):
        return NO_TESTS
    return next((status for status in statuses if status not in (0, NO_TESTS)), 0)


if __name__ == "__main__":
    sys.exit(main())
