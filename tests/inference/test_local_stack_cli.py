"""`python -m inference.sentiment.local_stack` as a user runs it:
SIGTERM ends it with status 0 and nothing left running.

A separate module from test_local_stack.py: the toolkit allows one TorchServe per machine, and that module's
stack runs until its last test.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time

import pytest

from inference.sentiment import local_stack

pytestmark = pytest.mark.skipif(
    not local_stack.SERVING_PYTHON.is_file() and not os.environ.get("REQUIRE_SERVING_STACK"),
    reason="no .venv-serving; run `make serving-stack`",
)


def _cli(archive, port, log):
    return subprocess.Popen(
        [sys.executable, "-m", "inference.sentiment.local_stack", "--model", str(archive),
         "--port", str(port), "--log", log],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=local_stack.ROOT, start_new_session=True,
    )


def _ping(port) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        connection.request("GET", "/ping")
        return connection.getresponse().status == 200
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("when", ["starting", "serving"])
def test_cli_exits_0_on_sigterm_and_leaves_nothing_running(archive, when, tmp_path):
    """SIGTERM while TorchServe starts, and once it serves: status 0, the port free, no process left."""
    port = local_stack.free_port()
    process = _cli(archive, port, tmp_path / "stack.log")
    try:
        if when == "serving":
            assert "serving" in process.stdout.readline()
            assert _ping(port)
        else:
            time.sleep(3)  # the toolkit and Java are starting
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, process.stdout.read()
        assert not _ping(port)
        with pytest.raises(ProcessLookupError):
            os.killpg(process.pid, 0)  # no toolkit, TorchServe or worker left in its group
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.skipif(not os.environ.get("SIGTERM_RUNS"), reason="set SIGTERM_RUNS=20 to repeat the SIGTERM test")
def test_cli_exits_0_on_sigterm_every_time(archive, tmp_path):
    """The reliability check from the issue: SIGTERM_RUNS runs in a row (about 15 s each on 2 cores)."""
    for run in range(int(os.environ["SIGTERM_RUNS"])):
        port = local_stack.free_port()
        process = _cli(archive, port, tmp_path / "stack.log")
        try:
            assert "serving" in process.stdout.readline(), f"run {run}"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0, f"run {run}: {process.stdout.read()}"
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
