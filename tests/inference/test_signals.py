"""Every server and long-running tool we start locally stops cleanly on SIGTERM and SIGINT (issue 24).

One table, `SERVERS`; each entry is run through `tests.signal_harness.run_case` for each of its (signal, mode)
cases: SIGTERM and SIGINT to the process group once, twice within a millisecond, and during start-up (before it
is ready), plus a signal to the process alone or a second one during the clean-up. After each: exit status 0 for
SIGTERM and 130 for SIGINT, no process the run started left, every port it listened on free for a new bind, and
nothing left in its temporary directory. Adding a server is one entry. Cases are chosen so that every mode is
covered without every product of them, because a TorchServe case costs 5-10 s on 2 cores.

TorchServe cases (`heavy`) run one at a time (the SageMaker toolkit allows one TorchServe per machine) and need
`make serving-stack`. GNU make (4.3 here) on SIGTERM or SIGINT waits for its children, prints the signal or the
child's status for the target ("*** [Makefile:N: serve-local-dlc] Terminated", "... Error 130"), then kills itself
with the same signal; on SIGTERM it also forwards SIGTERM to its children, so the server sees two. Its own status
is therefore death by that signal (-15 / -2 here); what we check is that it never reports "Error 1" and that the
server under it stops cleanly.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from common import processes
from inference.sentiment import local_stack
from inference.sentiment.server import local as image_server
from tests import fake_lmi
from tests.signal_harness import Server, both, http_ok, line, process_running, python, run_case

TORCHSERVE = "org.pytorch.serve.ModelServer"
# The fake binds its port microseconds after it starts: no start-up phase to hit.
NO_START_UP = ("group-once", "group-twice", "process-once", "cleanup")
# Issue 24's three modes with both signals, then one more mode each: every mode is covered without every product.
REQUIRED = tuple((signum, mode) for signum in (signal.SIGTERM, signal.SIGINT)
                 for mode in ("group-once", "group-twice", "starting"))
STACK_STARTING = both(line(r"starting TorchServe"), process_running(TORCHSERVE))  # Java up, /ping not yet 200


def _make(port, workdir, archive):
    # -o install-dev: use the environments as they are (their stamp files may be older than a fresh checkout).
    return ["make", "--no-print-directory", "-o", "install-dev", "serve-local-dlc", f"MODEL={archive}", f"PORT={port}",
            f"ARGS=--log {workdir / 'stack.log'}"]


def _image_server(port, workdir, archive):
    """The serving image's entry point, from the venv with the image's requirements (what `make serve-local` runs)."""
    return [str(image_server.IMAGE_PYTHON), "-m", "inference.sentiment.server", "serve", "--model-dir", str(archive),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "2"]


def _make_serve_local(port, workdir, archive):
    return ["make", "--no-print-directory", "-o", "image-venv", "serve-local", f"MODEL={archive}", f"PORT={port}"]


SERVERS = [
    Server("fake-lmi", lambda port, workdir, **_: python("-m", "tests.fake_lmi", "--port", str(port)),
           starting=line(r"fake LMI: starting"), ready=line(r"^listening on"), modes=NO_START_UP),
    Server("serve", lambda port, workdir, archive: python("-m", "inference.sentiment.serve", "--model-dir",
                                                          str(archive), "--port", str(port)),
           starting=line(r"loading the model"), ready=http_ok("/ping"),
           cases=(*REQUIRED, (signal.SIGTERM, "process-once"), (signal.SIGINT, "cleanup"))),
    Server("loadtest", lambda port, workdir, **_: python(
        "-m", "inference.llm.loadtest", "--url", f"http://127.0.0.1:{port}/invocations", "--kind", "llm",
        "--shape", "32x8", "--concurrency", "2", "--duration", "600", "--no-progress"),
           starting=lambda run: False, ready=lambda run: len(run.target.payloads) > 2,
           modes=("group-once", "group-twice", "process-once"),
           target=lambda port: fake_lmi.FakeLmi("rolling", port=port)),
    Server("local-stack", lambda port, workdir, archive: python(
        "-m", "inference.sentiment.local_stack", "--model", str(archive), "--port", str(port),
        "--log", str(workdir / "stack.log")),
           starting=STACK_STARTING, ready=line(r"^serving "), heavy=True,
           cases=(*REQUIRED, (signal.SIGTERM, "cleanup"), (signal.SIGTERM, "starting-process"))),
    Server("image-server", _image_server, starting=line(r"^sentiment server: starting"), ready=http_ok("/ping"),
           cases=(*REQUIRED, (signal.SIGTERM, "process-once"), (signal.SIGINT, "cleanup"))),
    Server("make-serve-local", _make_serve_local, starting=line(r"^sentiment server: starting"),
           ready=http_ok("/ping"), modes=("group-once",), exit_status=lambda signum: -signum,
           forbidden_output=("Traceback", r"Error 1$")),
    Server("make-serve-local-dlc", _make, starting=STACK_STARTING, ready=line(r"^serving "), heavy=True,
           modes=("group-once",), exit_status=lambda signum: -signum,
           forbidden_output=("Traceback", r"Error 1$")),
    Server("benchmark", lambda port, workdir, **_: python(
        "-m", "inference.sentiment.benchmark_handler", "--preset", "tiny", "--requests", "400", "--batch-sizes", "1",
        "--rounds", "1", "--no-int8", "--log", str(workdir / "stacks.log")),
           starting=line(r"benchmark_handler: starting"), ready=line(r"serving \S+ at http"), heavy=True,
           cases=((signal.SIGINT, "group-once"),)),  # its stack stops as local-stack's does: Ctrl-C only
]

pytestmark = pytest.mark.servers

CASES = [pytest.param(server, signum, mode, id=f"{server.name}-{signal.Signals(signum).name}-{mode}",
                      marks=[pytest.mark.slow, pytest.mark.torchserve] if server.heavy else [])
         for server in SERVERS for signum, mode in server.all_cases()]

def _wait_until_no_torchserve(timeout: float = 300) -> list[int]:
    """TorchServe front ends still running after waiting for them to end (on a shared machine, other runs')."""
    deadline = time.monotonic() + timeout
    while (running := local_stack.torchserve_pids()) and time.monotonic() < deadline:
        time.sleep(1)
    return running


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return "?"


_no_stack = not local_stack.SERVING_PYTHON.is_file() and not os.environ.get("REQUIRE_SERVING_STACK")
_no_image_venv = not image_server.IMAGE_PYTHON.is_file() and not os.environ.get("REQUIRE_SERVING_STACK")
IMAGE_VENV_SERVERS = ("image-server", "make-serve-local")


@pytest.mark.parametrize(("server", "signum", "mode"), CASES)
def test_stops_cleanly(server, signum, mode, archive, tmp_path):
    if server.heavy and _no_stack:
        pytest.skip("no .venv-serving; run `make serving-stack`")
    if server.name in IMAGE_VENV_SERVERS and _no_image_venv:
        pytest.skip("no .venv-image; run `make image-venv`")
    if server.heavy and (running := _wait_until_no_torchserve()):
        pytest.fail("a TorchServe not started by this test runs, and the toolkit allows one per machine: "
                    + "; ".join(f"{processes.describe(pid)} (in {_cwd(pid)})" for pid in running))
    outcome = run_case(server, signum, mode, tmp_path, archive=archive)
    print(f"{server.name} {signal.Signals(signum).name} {mode}: exit {outcome.returncode} in "
          f"{outcome.elapsed_s:.1f} s" + (f", signals {outcome.signal_gap_s * 1e6:.0f} us apart"
                                           if outcome.signal_gap_s is not None else ""), file=sys.stderr)
    outcome.check()
