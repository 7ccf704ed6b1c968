"""Stopping the servers and tools we start locally, however they are stopped.

A terminal's Ctrl-C, a CI timeout, a container runtime or a supervisor signals the whole process group, and GNU make
forwards a SIGTERM it receives to its children, so a tool often gets two signals within microseconds. What this
module gives every long-running entry point:

- `install_stop_handlers()`: the first SIGTERM or SIGINT raises `Stopped` in the main thread (ending a start-up
  wait as well as a serving loop); every later one is only recorded, so it can never interrupt the clean-up.
  `exit_status()` maps the signal to the exit status: 0 for SIGTERM, 130 for SIGINT; `finish()` exits with it
  so that a late repeat cannot kill the interpreter while it shuts down.
- `shielded()`: clean-up that no signal may interrupt, even when no signal has arrived yet.
- `deferred_stop_signals()`: around `subprocess.Popen`, so that a stop signal cannot lose the child it just forked.
- `poll()` and `wait()`: Popen's, made safe from a stop signal that would leave them unable to see the child exit.
- `mark()` and `stop_tree()`: stop a child and everything it started (its descendants, its process group or
  session if it has one of its own, and orphans found by an environment variable `mark` gave the child) with
  SIGTERM, then SIGKILL, and reap them.
- `describe()`: a leftover process named for the user, with its PID and the command that stops it.

Linux only (it reads /proc), like the serving stack it stops.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_EXIT_STATUS = {signal.SIGTERM: 0, signal.SIGINT: 130}
RUN_MARKER = "INFERENCE_PROCESS_RUN"


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived. A BaseException, so `except Exception` in serving code cannot swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return exit_status(self.signum)


def exit_status(signum: int | None) -> int:
    """0 after SIGTERM (a requested stop), 130 after SIGINT (the shell's 128 + 2 for Ctrl-C)."""
    return _EXIT_STATUS.get(signum, 0)


class _StopState:
    def __init__(self):
        self.installed = False
        self.received: int | None = None  # the first stop signal
        self.count = 0
        self.shield_depth = 0

    def handle(self, signum, _frame):
        self.count += 1
        if self.received is not None:
            return  # repeated: the first one is already being acted on
        self.received = signum
        if self.shield_depth == 0:
            raise Stopped(signum)


_STATE = _StopState()


def install_stop_handlers() -> _StopState:
    """SIGTERM and SIGINT handlers for this process, once; returns the state (`received`: the first signal).

    Call it first thing in `main()`, before anything slow, so a signal during start-up is handled too. Only the main
    thread can install handlers; elsewhere this is a no-op (and `shielded()` then changes nothing).
    """
    if not _STATE.installed and threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, _STATE.handle)
        _STATE.installed = True
    return _STATE


def received() -> int | None:
    """The first stop signal this process got since the handlers were installed, else None."""
    return _STATE.received


def finish(status: int) -> NoReturn:
    """Exit with `status`, ignoring stop signals from here on.

    Python resets its signal handlers to the defaults while the interpreter shuts down, so a repeated signal
    arriving then would still kill a program that had stopped cleanly (exit -2 instead of 130, seen in tests).
    Handlers set to SIG_IGN stay ignored.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(status)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Run clean-up that a stop signal must not interrupt: one arriving now is recorded (see `received()`)."""
    _STATE.shield_depth += 1
    try:
        yield
    finally:
        _STATE.shield_depth -= 1


@contextlib.contextmanager
def deferred_stop_signals() -> Iterator[None]:
    """A SIGTERM or SIGINT that arrives in the block reaches the handler it would have reached, when the block ends.

    For `subprocess.Popen`: the child exists from the fork on, but Popen returns only after the child's exec. A
    handler that raises in between (each stop handler here does) loses the Popen object, so no clean-up can stop the
    child. Seen by signalling a process as soon as its child appeared: 300 of 300 tries landed inside Popen. Only the
    main thread runs handlers; elsewhere this changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    replaced = {}
    try:
        for signum in STOP_SIGNALS:  # in the try: a handler that raises between two swaps leaves none swapped
            if signal.getsignal(signum) is not None:  # None: set outside Python, cannot be put back
                replaced[signum] = signal.signal(signum, lambda number, _frame: arrived.append(number))
        yield
    finally:
        _put_back(list(replaced.items()))
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)  # the handler put back runs now, and may raise


def _put_back(handlers: list) -> None:
    """Each (signal, handler) put back, even when one put back already raises for a signal arriving meanwhile."""
    if handlers:
        try:
            signal.signal(*handlers[0])
        finally:
            _put_back(handlers[1:])


def poll(process: subprocess.Popen) -> int | None:
    """`process.poll()` that a stop signal cannot break.

    Popen.poll and Popen.wait take a private lock before they call waitpid, and release it in a `finally` that the
    acquire is outside of (CPython 3.11 `subprocess.py`, `_internal_poll` and `_wait`). A handler that raises just
    after the acquire leaves the lock taken: from then on poll() says "running" for ever, wait(t) waits all of t
    and wait() never returns. With a raising handler, in a loop of poll() on the 2-vCPU Zen 2, 1 to 2 in 1,000
    signals sent from another process did that, and 1 in 4 from a timer (tests/common/test_processes.py reproduces
    it). The signal is deferred to the end of the call and raised there.
    """
    with deferred_stop_signals():
        return process.poll()


def wait(process: subprocess.Popen, timeout: float | None = None) -> int:
    """`process.wait(timeout)` that a stop signal cannot break (see `poll`): short polls, and sleeps between them
    where a stop signal is raised as usual, so it is not held back for the whole wait."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.0005
    while (status := poll(process)) is None:
        delay = min(delay * 2, 0.05)
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(process.args, timeout)
            delay = min(delay, remaining)
        time.sleep(delay)
    return status


def mark(env: dict[str, str]) -> tuple[dict[str, str], str]:
    """`env` plus a variable naming this run; every process started with it, and everything those start, carries it.

    It finds the processes of a run even after they are re-parented to init or leave its process group or session:
    TorchServe's launcher exits once the Java front end runs, leaving that an orphan.
    """
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    return {**env, RUN_MARKER: token}, f"{RUN_MARKER}={token}".encode()


def _marked(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, parent, process group, session, start time) from /proc/<pid>/stat, or None when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def members(root: int, marker: bytes | None = None) -> set[int]:
    """Live processes that belong to `root`: its descendants, its group's and session's members when it leads one
    (processes keep those when re-parented), and those carrying `marker` in their environment (see `mark`)."""
    table = {pid: stat for pid in _all_pids() if (stat := _stat(pid)) is not None and stat[0] != "Z"}
    children: dict[int, list[int]] = {}
    for pid, (_, parent, *_rest) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    if root != os.getpid():
        found |= {pid for pid, (_, _, group, session, _) in table.items() if root in (group, session)}
    if marker is not None:
        found |= {pid for pid in table if _marked(pid, marker)}
    if root in table:
        found.add(root)
    found.discard(os.getpid())
    return found


def _alive(pid: int, start: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and stat[4] == start


def _reap(pids) -> None:
    """Collect the exit status of those that are our children, so none stays a zombie."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def stop_tree(process: subprocess.Popen, *, marker: bytes | None = None, grace: float = 30,
              kill_after: float = 10) -> None:
    """Stop `process` and everything it started; returns when none of them is left.

    SIGTERM first to `process` alone (a parent such as the SageMaker toolkit forwards it to its server and waits
    for it), then after `grace` seconds, or as soon as `process` has exited, SIGTERM to every process that is left,
    then after `kill_after` more SIGKILL.
    Processes are identified by PID and start time, so a reused PID is never signalled. Safe to call again after an
    interruption and on a process that has already exited.
    """
    tracked: dict[int, int] = {}

    def refresh() -> dict[int, int]:
        for pid in members(process.pid, marker):
            stat = _stat(pid)
            if stat is not None:
                tracked.setdefault(pid, stat[4])
        poll(process)
        _reap(pid for pid in tracked if pid != process.pid)
        return {pid: start for pid, start in tracked.items() if _alive(pid, start)}

    def settle(seconds: float, while_root_runs: bool = False) -> dict[int, int]:
        deadline = time.monotonic() + seconds
        while (left := refresh()) and time.monotonic() < deadline:
            if while_root_runs and process.pid not in left:
                break  # nobody is left to forward the stop to the rest
            time.sleep(0.1)
        return left

    left = refresh()
    if process.pid in left:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    left = settle(grace, while_root_runs=True)
    for sig, seconds in ((signal.SIGTERM, kill_after), (signal.SIGKILL, 5)):
        if not left:
            break
        for pid, start in left.items():
            if _alive(pid, start):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        left = settle(seconds)
    with contextlib.suppress(subprocess.TimeoutExpired):
        wait(process, timeout=5)


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def describe(pid: int, width: int = 160) -> str:
    """'pid N (command ...), stop it with: kill -TERM N' for a leftover that blocks a start."""
    command = command_line(pid)
    if len(command) > width:
        command = command[:width - 3] + "..."
    return f"pid {pid} ({command}); stop it with: kill -TERM {pid}"
