"""`make test`'s one pytest run over pytest-xdist workers (tests/stop_signals.py): a CI time-out (SIGTERM to pytest)
or Ctrl-C (SIGINT) still runs every test's teardown, where the servers it started stop; a failure on any worker
fails the run. Run on a small project of its own, with real pytest processes. And the groups tests/conftest.py gives
xdist, and the order it hands them out in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import CDK_GROUP, LONGEST_GROUPS, REPO_ROOT, longest_groups_first, xdist_group

INI = """
[pytest]
addopts = -q -p tests.stop_signals -p no:cacheprovider
"""
# Each test starts a "server" (a child process that would outlive a killed worker) and stops it in teardown.
CONFTEST = """
import pathlib, subprocess, sys
import pytest

@pytest.fixture(autouse=True)
def server(request):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    pathlib.Path(f"{request.node.name}.{child.pid}.started").touch()
    yield
    child.terminate()
    child.wait()
    pathlib.Path(f"{request.node.name}.stopped").touch()
"""


def project(tmp_path: Path, body: str) -> Path:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_one.py").write_text(f"def test_one():\n    {body}\n")
    (tmp_path / "test_two.py").write_text("def test_two():\n    assert True\n" if "sleep" not in body
                                          else f"def test_two():\n    {body}\n")
    return tmp_path


def pytest_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "xdist.plugin", "-n", "2", *args]


def environment() -> dict[str, str]:
    """Only the plugins the run needs (xdist and ours): each of the three processes starts in a second, not three."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def test_a_failure_on_one_worker_fails_the_run_and_every_test_runs_once(tmp_path):
    project(tmp_path, "assert False, 'this one fails'")
    done = subprocess.run(pytest_command(), cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=environment())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout
    assert sorted(path.name for path in tmp_path.glob("*.stopped")) == ["test_one.stopped", "test_two.stopped"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_runs_every_workers_teardown_and_the_run_ends_interrupted(tmp_path, signum):
    """SIGTERM or SIGINT to pytest alone (not its group): each worker gets one SIGINT, its tests' teardown runs."""
    project(tmp_path, "__import__('time').sleep(120)")
    runner = subprocess.Popen(pytest_command(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=environment())
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("*.started"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # polls for the event (both tests running), no fixed wait
        started = sorted(tmp_path.glob("*.started"))
        assert len(started) == 2, f"both tests did not start within 90 s: {started}"
        servers = [int(path.name.split(".")[1]) for path in started]
        workers = psutil.Process(runner.pid).children()
        runner.send_signal(signum)
        output, _ = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == pytest.ExitCode.INTERRUPTED, output
    assert sorted(path.name for path in tmp_path.glob("*.stopped")) == ["test_one.stopped", "test_two.stopped"], output
    assert not [pid for pid in servers if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, output


def test_a_module_stays_on_one_worker_and_the_in_process_cdk_modules_share_one():
    assert xdist_group("tests/inference/test_server.py") == "tests/inference/test_server.py"
    assert xdist_group("tests/training/test_sagemaker_entry.py") == "tests/training/test_sagemaker_entry.py"
    for module in ("tests/test_sentiment_stack.py", "tests/test_cli.py", "tests/test_patch_windows.py"):
        assert xdist_group(module) == CDK_GROUP, module  # `synthesized`, app.main in-process


def test_each_of_the_longest_groups_names_a_group_of_the_suite():
    """A renamed or regrouped module would silently fall back to xdist's order: each entry must still be a group."""
    assert len(set(LONGEST_GROUPS)) == len(LONGEST_GROUPS)
    for group in LONGEST_GROUPS:
        assert group == CDK_GROUP or ((REPO_ROOT / group).is_file() and xdist_group(group) == group), group


def test_the_longest_groups_are_handed_out_first_in_their_order_and_the_rest_as_collected():
    class Item:
        def __init__(self, nodeid: str):
            self.nodeid = nodeid

    collected = [Item(nodeid) for nodeid in (
        "tests/common/test_processes.py::test_a", "tests/inference/test_server.py::test_a",
        "tests/test_sentiment_stack.py::test_a", "tests/training/test_compile.py::test_a",
        "tests/inference/test_server.py::test_b", "tests/loadtest/test_http.py::test_a",
        "tests/training/test_bench_train.py::test_a")]
    longest_groups_first(collected)
    assert [item.nodeid for item in collected] == [
        "tests/test_sentiment_stack.py::test_a", "tests/training/test_bench_train.py::test_a",
        "tests/training/test_compile.py::test_a", "tests/inference/test_server.py::test_a",
        "tests/inference/test_server.py::test_b", "tests/common/test_processes.py::test_a",
        "tests/loadtest/test_http.py::test_a"]
