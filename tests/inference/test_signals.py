"""Every server and long-running tool we start locally stops cleanly on SIGTERM and SIGINT (issue 24).

One table, `SERVERS`; each entry is run through `tests.signal_harness.run_case` for each of its (signal, mode)
cases: SIGTERM or SIGINT to the process group once, twice within a millisecond, and during start-up (before it is
ready), to the process alone, or a second one during the clean-up. After each: the exit status for that signal (0
after SIGTERM, 130 after SIGINT: one function, `common.processes.exit_status`, unit-tested in
tests/common/test_processes.py), no process the run started left, every port it listened on free for a new bind,
and nothing left in its temporary directory. Adding a server is one entry. Each server runs each of its modes once,
the two signals taking turns across its cases: the mode is what a real process can get wrong, the status a signal
maps to is the same code for every mode. Our server's group-twice and start-up modes run in
tests/inference/test_server.py, with its other real-process scenarios.

GNU make (4.3 here) on SIGTERM or SIGINT waits for its children, prints the signal or the child's status for the
target ("*** [Makefile:N: serve-local] Terminated", "... Error 130"), then kills itself with the same signal; on
SIGTERM it also forwards SIGTERM to its children, so the server sees two. Its own status is therefore death by that
signal (-15 / -2 here); what we check is that it never reports "Error 1" and that the server under it stops cleanly.
The TorchServe servers of the retired runtime (`sentiment.runtime=dlc`: the light local server, the local stack and
its make target, the handler benchmark) left this table with it (issue 43).
"""

from __future__ import annotations

import signal
import sys

import pytest

from inference.sentiment.server import local as image_server
from tests import fake_lmi
from tests.conftest import prerequisite
from tests.signal_harness import Server, http_ok, line, python, run_case

TERM, INT = signal.SIGTERM, signal.SIGINT


def _image_server(port, workdir, archive):
    """The serving image's entry point, from the venv with the image's requirements (what `make serve-local` runs)."""
    return [str(image_server.IMAGE_PYTHON), "-m", "inference.sentiment.server", "serve", "--model-dir", str(archive),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "2", "--precision", "fp32"]  # no start-up race


def _make_serve_local(port, workdir, archive):
    return ["make", "--no-print-directory", "-o", "image-venv", "serve-local", f"MODEL={archive}", f"PORT={port}",
            "ARGS=--precision fp32"]


SERVERS = [
    Server("fake-lmi", lambda port, workdir, **_: python("-m", "tests.fake_lmi", "--port", str(port)),
           starting=line(r"fake LMI: starting"), ready=line(r"^listening on"),  # no start-up phase to hit: it
           # binds its port microseconds after it starts
           cases=((TERM, "group-once"), (INT, "group-twice"), (TERM, "process-once"), (INT, "cleanup"))),
    Server("loadtest", lambda port, workdir, **_: python(
        "-m", "inference.llm.loadtest", "--url", f"http://127.0.0.1:{port}/invocations", "--kind", "llm",
        "--shape", "32x8", "--concurrency", "2", "--duration", "600", "--no-progress"),
           starting=lambda run: False, ready=lambda run: len(run.target.payloads) > 2,
           cases=((INT, "group-once"), (TERM, "group-twice"), (INT, "process-once")),
           target=lambda port: fake_lmi.FakeLmi("rolling", port=port)),
    # (SIGTERM, starting-process) was the retired local stack's case: every mode stays covered.
    Server("image-server", _image_server, starting=line(r"^sentiment server: starting"), ready=http_ok("/ping"),
           cases=((TERM, "group-once"), (TERM, "process-once"), (INT, "cleanup"), (TERM, "starting-process"))),
    Server("make-serve-local", _make_serve_local, starting=line(r"^sentiment server: starting"),
           ready=http_ok("/ping"), cases=((TERM, "group-once"),), exit_status=lambda signum: -signum,
           forbidden_output=("Traceback", r"Error 1$")),
]

pytestmark = pytest.mark.servers

IMAGE_VENV_SERVERS = ("image-server", "make-serve-local")
needs_image_venv = prerequisite(image_server.IMAGE_PYTHON.is_file(), "no .venv-image; run `make image-venv`")
CASES = [pytest.param(server, signum, mode, id=f"{server.name}-{signal.Signals(signum).name}-{mode}",
                      marks=[needs_image_venv] if server.name in IMAGE_VENV_SERVERS else [])
         for server in SERVERS for signum, mode in server.all_cases()]


@pytest.mark.parametrize(("server", "signum", "mode"), CASES)
def test_stops_cleanly(server, signum, mode, archive, tmp_path):
    outcome = run_case(server, signum, mode, tmp_path, archive=archive)
    print(f"{server.name} {signal.Signals(signum).name} {mode}: exit {outcome.returncode} in "
          f"{outcome.elapsed_s:.1f} s" + (f", signals {outcome.signal_gap_s * 1e6:.0f} us apart"
                                           if outcome.signal_gap_s is not None else ""), file=sys.stderr)
    assert outcome.returncode == server.exit_status(signum), outcome.output[-4000:]
    outcome.check()  # and: no process, port or file left, nothing forbidden printed
