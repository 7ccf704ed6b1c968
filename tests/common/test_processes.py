"""common.processes: stop_tree finds what a child started even when it escaped the child's session, and
escalates to SIGKILL for what ignores SIGTERM; a repeated signal cannot interrupt the clean-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from common import processes
from tests.conftest import REPO_ROOT

# A child that starts a grandchild in a session of its own (as a daemonizing server does), prints its PID, waits.
ESCAPER = textwrap.dedent("""
    import subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", {grandchild!r}], start_new_session=True)
    print(grandchild.pid, flush=True)
    time.sleep(120)
""")


def _spawn(grandchild: str, env=None):
    process = subprocess.Popen([sys.executable, "-c", ESCAPER.format(grandchild=grandchild)], env=env,
                               stdout=subprocess.PIPE, text=True)
    return process, int(process.stdout.readline())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_stop_tree_finds_a_grandchild_in_its_own_session_by_the_environment_marker():
    env, marker = processes.mark(dict(os.environ))
    process, grandchild = _spawn("import time; time.sleep(120)", env)
    try:
        assert os.getsid(grandchild) == grandchild  # out of reach of any group or session signal
        assert grandchild in processes.members(process.pid, marker)
        processes.stop_tree(process, marker=marker, grace=5)
        assert process.returncode == -signal.SIGTERM and _gone(grandchild)
    finally:
        for pid in (process.pid, grandchild):
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_stop_tree_kills_what_ignores_sigterm():
    env, marker = processes.mark(dict(os.environ))
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    process, grandchild = _spawn(stubborn, env)
    try:
        processes.stop_tree(process, marker=marker, grace=1, kill_after=1)
        assert _gone(grandchild)
    finally:
        for pid in (process.pid, grandchild):
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


# A program that cleans up for a while after the first signal and records every signal it gets.
CLEANER = textwrap.dedent("""
    import sys, time
    from common import processes
    state = processes.install_stop_handlers()
    try:
        print("ready", flush=True)
        time.sleep(60)
    except processes.Stopped:
        print("stopping", flush=True)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # clean-up, signalled again meanwhile
            time.sleep(0.01)
        print("cleaned", state.count, flush=True)
    processes.finish(processes.exit_status(processes.received()))
""")


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_repeated_signals_during_the_clean_up_are_ignored(signum, status):
    process = subprocess.Popen([sys.executable, "-c", CLEANER], stdout=subprocess.PIPE, text=True,
                               cwd=REPO_ROOT)
    try:
        assert process.stdout.readline() == "ready\n"
        process.send_signal(signum)
        assert process.stdout.readline() == "stopping\n"
        for _ in range(3):
            process.send_signal(signum)
        assert process.wait(timeout=30) == status
        word, count = process.stdout.read().split()
        assert word == "cleaned" and int(count) >= 2  # identical pending signals may merge into one
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# LocalServer.start with a stop signal that lands after the fork but before Popen returns (a wrapper sends it and
# lets the handler run, still inside "Popen"); the server command is a real child process.
POPEN_RACE = textwrap.dedent("""
    import os, signal, subprocess, sys
    from pathlib import Path
    from common import processes
    from inference.sentiment.server import local

    processes.install_stop_handlers()
    real_popen, children = subprocess.Popen, []

    def popen_then_signal(*args, **kwargs):
        children.append(real_popen(*args, **kwargs))
        os.kill(os.getpid(), signal.{signal})
        for _ in range(10_000):  # a stop handler runs at one of these bytecode boundaries, unless it is deferred
            pass
        return children[-1]

    subprocess.Popen = popen_then_signal
    server = local.LocalServer(Path("no-such-model"), python=Path(sys.executable))
    try:
        server.start(timeout=60)
        print("started")
    except processes.Stopped as stop:
        child = children[0]
        reached = server.process is child and child.poll() is not None
        print("stopped", stop, "child stopped by LocalServer.stop" if reached else "child lost", flush=True)
        if not reached:
            child.kill()
            child.wait()
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_during_popen_cannot_lose_the_child(signum):
    completed = subprocess.run([sys.executable, "-c", POPEN_RACE.format(signal=signal.Signals(signum).name)],
                               capture_output=True, text=True, timeout=120,
                               cwd=REPO_ROOT)
    assert completed.stdout.strip() == f"stopped {signal.Signals(signum).name} child stopped by LocalServer.stop", (
        completed.stdout + completed.stderr[-2000:])


# A stop handler that raises on every signal while the main thread polls a child, 300 times. Each time the stop
# signal is raised from a SIGALRM handler, so it is handled at a random bytecode boundary, as the kernel can deliver
# one from another process (rarely: 1 to 2 in 1,000 landed in Popen.poll's gap that way; a timer hits it far more
# often). Then the child is killed, and must be seen to exit.
POLL_RACE = textwrap.dedent("""
    import os, random, signal, subprocess, sys
    from common import processes

    class Stop(BaseException):
        pass

    def stop(_number, _frame):
        raise Stop

    signal.signal(signal.{signal}, stop)
    signal.signal(signal.SIGALRM, lambda _number, _frame: signal.raise_signal(signal.{signal}))
    poll = processes.poll if sys.argv[1] == "processes.poll" else subprocess.Popen.poll
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    random.seed(0)
    for _ in range(300):
        try:
            signal.setitimer(signal.ITIMER_REAL, random.uniform(0.00001, 0.0005))
            while True:
                poll(child)
        except Stop:
            pass
    child.kill()
    try:
        print("exit seen:", processes.wait(child, timeout=10))
    except subprocess.TimeoutExpired:
        print("exit not seen: the child looks alive after SIGKILL")
        os.waitpid(child.pid, 0)
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_during_poll_cannot_hide_the_childs_exit(signum):
    """Popen.poll leaves its waitpid lock taken when a handler raises just after it took it (processes.poll's
    docstring); `subprocess.Popen.poll` in place of `processes.poll` prints "exit not seen" here."""
    completed = subprocess.run([sys.executable, "-c", POLL_RACE.format(signal=signal.Signals(signum).name),
                                "processes.poll"], capture_output=True, text=True, timeout=120,
                               cwd=REPO_ROOT)
    assert completed.stdout.strip() == f"exit seen: {-signal.SIGKILL}", completed.stdout + completed.stderr[-2000:]


def test_wait_times_out_like_popen_wait_and_returns_the_status():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(3)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            processes.wait(child, timeout=0.01)
        assert processes.wait(child, timeout=30) == 3
        assert processes.poll(child) == 3
    finally:
        child.kill()
        child.wait()


def test_exit_status():
    assert processes.exit_status(signal.SIGTERM) == 0
    assert processes.exit_status(signal.SIGINT) == 130
    assert processes.Stopped(signal.SIGINT).exit_status == 130
