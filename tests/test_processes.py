"""inference.processes: stop_tree finds what a child started even when it escaped the child's session, and
escalates to SIGKILL for what ignores SIGTERM; a repeated signal cannot interrupt the clean-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from inference import processes

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
    from inference import processes
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
                               cwd=processes.Path(__file__).resolve().parents[1])
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


def test_exit_status():
    assert processes.exit_status(signal.SIGTERM) == 0
    assert processes.exit_status(signal.SIGINT) == 130
    assert processes.Stopped(signal.SIGINT).exit_status == 130
