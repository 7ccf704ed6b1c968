"""`make test`'s concurrent pytest lanes (tests/lanes.py): every test runs in exactly one, and a failure in
either decides the exit status. Run on a small project of its own, with real pytest processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests import lanes

LANES_SCRIPT = Path(lanes.__file__)
INI = """
[pytest]
markers =
    torchserve: starts TorchServe
    servers: starts servers
addopts = --strict-markers -q
"""


def project(tmp_path: Path, rest_body: str = "assert True") -> Path:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_heavy.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.torchserve
        def test_in_the_torchserve_lane():
            assert True

        @pytest.mark.servers
        def test_in_the_servers_lane():
            assert True
    """))
    (tmp_path / "test_light.py").write_text(f"def test_in_the_rest_lane():\n    {rest_body}\n")
    return tmp_path


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LANES_SCRIPT), "--progress", "0.5", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_each_test_runs_once_in_its_lane_and_a_failure_in_one_lane_fails_the_run(tmp_path):
    result = run(project(tmp_path, rest_body="assert 1 == 2"), "--", "-rA")
    assert result.returncode == 1, result.stdout + result.stderr
    torchserve, servers, rest = (result.stdout.split(f"===== lane {name}: ")[1].split("=====", 1)[0]
                                 for name in ("torchserve", "servers", "rest"))
    assert torchserve.startswith("exit 0") and servers.startswith("exit 0") and rest.startswith("exit 1")
    assert result.stdout.count("PASSED test_heavy.py::test_in_the_torchserve_lane") == 1
    assert result.stdout.count("PASSED test_heavy.py::test_in_the_servers_lane") == 1
    assert result.stdout.count("FAILED test_light.py::test_in_the_rest_lane") == 1
    assert "lanes: pytest took" in result.stdout


def test_arguments_reach_both_lanes_an_empty_lane_passes_and_no_test_at_all_is_pytests_5(tmp_path):
    result = run(project(tmp_path), "--", "-k", "rest_lane")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 2 deselected" in result.stdout  # the rest lane: -m took two away, -k none
    assert result.stdout.count("3 deselected") == 2  # each of the others: -m took two away, -k the third
    assert run(tmp_path, "--", "-k", "nothing_matches").returncode == 5


@pytest.mark.parametrize("argv", [["--progress", "0"], ["--progress", "soon"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as raised:
        lanes.main(argv)
    assert raised.value.code == 2
    assert "--progress" in capsys.readouterr().err


def test_a_lane_marker_outside_tests_inference_is_refused_at_collection(request):
    from tests import conftest

    conftest.pytest_collection_modifyitems(request.config, [request.node])  # this test: tests/, no lane marker
    request.node.add_marker(pytest.mark.servers)
    with pytest.raises(pytest.UsageError, match=r"test_a_lane_marker_outside.* \(lane servers collects tests/inf"):
        conftest.pytest_collection_modifyitems(request.config, [request.node])


def stuck(runner: subprocess.Popen, lanes_running: list) -> str:
    """What a runner that did not stop in time was doing: its stack (lanes.py dumps it on SIGUSR1), its output so
    far, and each lane's state. Seen once in a fresh-clone run (SIGTERM, nothing on stderr after 60 s)."""
    runner.send_signal(signal.SIGUSR1)
    try:
        out, err = runner.communicate(timeout=5)
    except subprocess.TimeoutExpired as expired:
        out, err = expired.output, expired.stderr
    states = []
    for lane in lanes_running:
        try:
            states.append(f"{lane.pid} {lane.status()} {' '.join(lane.cmdline()[-6:])}")
        except psutil.Error as error:
            states.append(f"{lane.pid} {type(error).__name__}")
    return (f"the runner did not stop within 60 s\nlanes: {states}\nstdout: {out}\nstderr (stack from SIGUSR1): "
            f"{err}")


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_stop_signal_tears_every_lane_down_and_exits_with_its_status(tmp_path, signum, status):
    """A CI timeout or Ctrl-C: each lane gets one SIGINT, so its fixtures' teardown runs (where servers stop)."""
    project(tmp_path)
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        import pathlib
        import pytest

        @pytest.fixture(autouse=True)
        def server(request):
            name = request.node.name
            pathlib.Path(name + ".started").touch()
            yield
            pathlib.Path(name + ".stopped").touch()
    """))
    for path in tmp_path.glob("test_*.py"):  # every test now waits to be stopped
        path.write_text(path.read_text().replace("assert True", "__import__('time').sleep(120)"))
    runner = subprocess.Popen([sys.executable, str(LANES_SCRIPT), "--progress", "0.5"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.started"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        lanes_running = psutil.Process(runner.pid).children()
        assert len(lanes_running) == 3, lanes_running
        runner.send_signal(signum)
        try:
            _, err = runner.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(stuck(runner, lanes_running))
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert runner.returncode == status, err
    assert sorted(path.name for path in tmp_path.glob("*.stopped")) == [
        "test_in_the_rest_lane.stopped", "test_in_the_servers_lane.stopped", "test_in_the_torchserve_lane.stopped"]
    assert f"lanes: stopped by {signal.Signals(signum).name}" in err
    _, alive = psutil.wait_procs(lanes_running, timeout=10)
    assert not alive
