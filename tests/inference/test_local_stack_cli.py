"""`python -m inference.sentiment.local_stack` as a user runs it: what a crash leaves, and stopping it many times.

How it stops on SIGTERM and SIGINT (group, repeated, during start-up and clean-up) is in test_signals.py, with
every other server. A separate module from test_local_stack.py: the toolkit allows one TorchServe per machine, and
that module's stack runs until its last test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from common import processes
from inference.sentiment import local_stack
from tests.inference.test_signals import SERVERS
from tests.signal_harness import free_port, run_case

pytestmark = [pytest.mark.torchserve, pytest.mark.skipif(
    not local_stack.SERVING_PYTHON.is_file() and not os.environ.get("REQUIRE_SERVING_STACK"),
    reason="no .venv-serving; run `make serving-stack`",
)]


def _cli(archive, port, log):
    return subprocess.Popen(
        [sys.executable, "-m", "inference.sentiment.local_stack", "--model", str(archive), "--port", str(port),
         "--log", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=local_stack.ROOT, start_new_session=True,
    )


def _session(sid: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


@pytest.mark.slow
def test_a_leftover_from_a_crash_is_named_with_its_pid_and_the_command_that_stops_it(archive, tmp_path):
    """SIGKILL (no clean-up possible) leaves TorchServe running; the next start names it, and its command works."""
    first = _cli(archive, free_port(), tmp_path / "first.log")
    try:
        assert first.stdout.readline().startswith(f"{local_stack.PROG}: starting")
        assert first.stdout.readline().startswith("serving"), first.stdout.read()
        first.kill()  # this process only, as a crash or the OOM killer would
        first.wait()
        [java] = [pid for pid in local_stack.torchserve_pids() if os.getsid(pid) == first.pid]
        second = subprocess.run(
            [sys.executable, "-m", "inference.sentiment.local_stack", "--model", str(tmp_path / "missing"),
             "--port", str(free_port())],
            capture_output=True, text=True, cwd=local_stack.ROOT, timeout=60, check=False)
        assert second.returncode == 1
        assert f"pid {java} (java " in second.stderr and f"stop it with: kill -TERM {java}" in second.stderr, \
            second.stderr
        os.kill(java, signal.SIGTERM)  # the command it printed
        psutil.wait_procs(_session(first.pid), timeout=60)
        assert _session(first.pid) == []  # TorchServe, its workers and the orphaned toolkit are all gone
    finally:
        for process in _session(first.pid):
            process.kill()


def test_the_leftover_message_names_each_pid():
    decoy = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)",
                              "org.pytorch.serve.ModelServer"], stdout=subprocess.PIPE, text=True)
    try:
        assert decoy.stdout.readline() == "up\n"
        assert decoy.pid in local_stack.torchserve_pids()
        message = processes.describe(decoy.pid)
        assert message.startswith(f"pid {decoy.pid} (") and message.endswith(f"kill -TERM {decoy.pid}")
        assert "org.pytorch.serve.ModelServer" in message
    finally:
        decoy.kill()
        decoy.wait()


@pytest.mark.skipif(not os.environ.get("SIGTERM_RUNS"), reason="set SIGTERM_RUNS=20 to repeat the SIGTERM test")
def test_cli_exits_0_on_sigterm_every_time(archive, tmp_path):
    """The reliability check from issue 15: SIGTERM_RUNS group SIGTERMs in a row (about 10 s each on 2 cores)."""
    [server] = [server for server in SERVERS if server.name == "local-stack"]
    for run in range(int(os.environ["SIGTERM_RUNS"])):
        outcome = run_case(server, signal.SIGTERM, "group-twice", tmp_path / f"run-{run}", archive=archive)
        assert outcome.returncode == 0, f"run {run}: exit {outcome.returncode}"
        outcome.check()
