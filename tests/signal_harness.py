"""Start a server or tool, signal it the ways users, terminals, CI and make do, and check it stopped cleanly.

`run_case(server, signum, mode, workdir)` starts `server`'s command in a session and process group of its own,
waits for an event (a line it prints, or a condition polled on its port or process tree; never a fixed sleep),
sends the signal, and returns an `Outcome` that `check()` turns into assertions: the exit status, that no process
the run started is left (every process of its session, every descendant, and every process carrying the run's
environment marker, recorded while it ran), that every port it listened on accepts a new bind, and that it left
nothing in its own temporary directory (PID files, lock files, extracted models).

Modes:
- `group-once`: once it is ready, one signal to its process group (a terminal's Ctrl-C, a CI timeout).
- `group-twice`: once ready, two signals to the group back to back, well within a millisecond (what GNU make's
  forwarding of SIGTERM, or an impatient supervisor, adds to a group signal).
- `starting`: one signal to the group during start-up, after it announced it is starting and before it is ready.
- `process-once`: once ready, one signal to the process alone (`kill PID`).
- `starting-process`: one signal to the process alone during start-up: its children get nothing from the sender.
- `cleanup`: once ready, a signal to the group, then a second one when it prints that it is stopping.

Adding a server is one `Server` entry (see tests/inference/test_signals.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from common import processes

ROOT = Path(__file__).resolve().parents[1]
MODES = ("group-once", "group-twice", "starting", "process-once", "starting-process", "cleanup")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Run:
    """What an event looks at: the output so far, the port, the processes seen."""

    port: int
    target: object = None  # what `Server.target` yielded, if anything
    lines: list[str] = field(default_factory=list)
    pids: dict[int, float] = field(default_factory=dict)  # pid -> create time, every process the run started


# --- events: each a callable(Run) -> bool, polled until true -------------------------------------------------------

def line(pattern: str) -> Callable[[Run], bool]:
    """A line of the run's output (stdout and stderr) matches `pattern`."""
    compiled = re.compile(pattern)
    return lambda run: any(compiled.search(text) for text in list(run.lines))


def http_ok(path: str = "/ping") -> Callable[[Run], bool]:
    """GET `path` on the run's port answers 200."""
    import http.client

    def ready(run: Run) -> bool:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", run.port, timeout=2)
            try:
                connection.request("GET", path, headers={"Connection": "close"})
                response = connection.getresponse()
                response.read()  # unread data would make close() reset the connection: noise in the server's log
                return response.status == 200
            finally:
                connection.close()
        except (OSError, http.client.HTTPException):
            return False

    return ready


def process_running(fragment: str) -> Callable[[Run], bool]:
    """A process of the run has `fragment` on its command line (e.g. TorchServe's Java front end)."""

    def running(run: Run) -> bool:
        for pid in list(run.pids):
            try:
                if any(fragment in part for part in psutil.Process(pid).cmdline()):
                    return True
            except psutil.Error:
                continue
        return False

    return running


STOPPING = line(r"\bstopping\b")


def both(*events: Callable[[Run], bool]) -> Callable[[Run], bool]:
    return lambda run: all(event(run) for event in events)


@dataclass
class Server:
    """One entry of the table: how to start it, how to know it is starting and ready, what it must exit with."""

    name: str
    command: Callable[..., list[str]]  # (port=, workdir=, **params of run_case) -> argv
    starting: Callable[[Run], bool]  # start-up has begun and its stop handlers are installed
    ready: Callable[[Run], bool]
    stopping: Callable[[Run], bool] = STOPPING  # its clean-up has begun (for the `cleanup` mode)
    modes: tuple[str, ...] = ("group-once", "group-twice", "starting")
    exit_status: Callable[[int], int] = processes.exit_status
    forbidden_output: tuple[str, ...] = ("Traceback",)  # regular expressions, per line
    env: dict[str, str] = field(default_factory=dict)
    start_timeout: float = 120
    stop_timeout: float = 60
    signals: tuple[int, ...] = SIGNALS
    cases: tuple[tuple[int, str], ...] | None = None  # (signal, mode) pairs instead of signals x modes
    # A server the command needs (a load test's target), run in this process on the run's port: port -> context.
    target: Callable[[int], contextlib.AbstractContextManager] | None = None

    def all_cases(self) -> list[tuple[int, str]]:
        return list(self.cases or [(signum, mode) for signum in self.signals for mode in self.modes])


@dataclass
class Outcome:
    server: Server
    signum: int
    mode: str
    returncode: int | None
    output: str
    leftovers: list[str]  # processes still running after it exited
    busy_ports: list[int]
    leftover_files: list[str]
    ready_at_signal: bool
    signal_gap_s: float | None  # between the two signals of `group-twice`
    elapsed_s: float

    def check(self) -> None:
        label = f"{self.server.name} {signal.Signals(self.signum).name} {self.mode}"
        tail = self.output[-4000:]
        assert self.returncode == self.server.exit_status(self.signum), \
            f"{label}: exit status {self.returncode}, expected {self.server.exit_status(self.signum)}\n{tail}"
        assert not self.leftovers, f"{label}: still running after it exited: {self.leftovers}\n{tail}"
        assert not self.busy_ports, f"{label}: ports still bound: {self.busy_ports}\n{tail}"
        assert not self.leftover_files, f"{label}: files left in its temporary directory: {self.leftover_files}"
        for pattern in self.server.forbidden_output:
            assert not re.search(pattern, self.output, re.MULTILINE), f"{label}: {pattern!r} in its output\n{tail}"
        if self.mode.startswith("starting"):
            assert not self.ready_at_signal, f"{label}: it was already ready when signalled; not a start-up case"


class _Watcher:
    """Reads the run's output and records every process it starts, in threads, until stopped."""

    def __init__(self, process: subprocess.Popen, run: Run, marker: bytes):
        self.process, self.run, self.marker = process, run, marker
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._track, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        for text in self.process.stdout:
            self.run.lines.append(text.rstrip("\n"))

    def scan(self) -> None:
        for pid in processes.members(self.process.pid, self.marker):
            if pid not in self.run.pids:
                with contextlib.suppress(psutil.Error):
                    self.run.pids[pid] = psutil.Process(pid).create_time()

    def _track(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(0.05)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)


def _wait_for(event: Callable[[Run], bool], run: Run, process: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not event(run):
        if process.poll() is not None:
            raise AssertionError(f"it exited with {process.returncode} before it was {what}:\n"
                                 + "\n".join(run.lines[-60:]))
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout:.0f} s:\n" + "\n".join(run.lines[-60:]))
        time.sleep(0.02)


@contextlib.contextmanager
def _not_preempted():
    """Real-time priority for this thread where allowed (root, CAP_SYS_NICE): the processes a signal wakes would
    otherwise take the CPU between two back-to-back signals on a 2-core machine (measured: 5 ms apart)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError):
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def _signal_twice(pgid: int, signum: int) -> float:
    """Two signals to the group back to back; returns the seconds between them (reported, not asserted)."""
    with _not_preempted():
        first = time.perf_counter()
        os.killpg(pgid, signum)
        os.killpg(pgid, signum)
        return time.perf_counter() - first


def _listening_ports(pids) -> set[int]:
    ports = set()
    for pid in list(pids):  # a snapshot: the watcher thread adds pids meanwhile
        try:
            for connection in psutil.Process(pid).net_connections(kind="inet"):
                if connection.status == psutil.CONN_LISTEN:
                    ports.add(connection.laddr.port)
        except psutil.Error:
            continue
    return ports


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT does not count
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _alive(pid: int, created: float) -> bool:
    try:
        process = psutil.Process(pid)
        return process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_case(server: Server, signum: int, mode: str, workdir: Path, **params) -> Outcome:
    """Start `server`, signal it as `mode` says, wait for it to exit; returns what happened (see `Outcome.check`).

    `params` go to `server.command` (say the model archive to serve).
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    port = free_port()
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(server.target(port)) if server.target else None
        outcome = _run(server, signum, mode, workdir, port, target, params)
    outcome.busy_ports = sorted(port for port in outcome.busy_ports if not _bindable(port))
    return outcome


def _run(server: Server, signum: int, mode: str, workdir: Path, port: int, target, params) -> Outcome:
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env, marker = processes.mark({**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp),
                                  **server.env})
    run = Run(port, target)
    started = time.monotonic()
    argv = server.command(port=port, workdir=workdir, **params)
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    watcher = _Watcher(process, run, marker)
    gap = None
    ready_at_signal = False
    ports = {port}
    try:
        if mode.startswith("starting"):
            _wait_for(server.starting, run, process, server.start_timeout, "starting")
            ready_at_signal = server.ready(run)
        else:
            _wait_for(server.ready, run, process, server.start_timeout, "ready")
            ready_at_signal = True
        watcher.scan()
        ports |= _listening_ports(run.pids)
        if mode == "group-twice":
            gap = _signal_twice(process.pid, signum)
        elif mode in ("process-once", "starting-process"):
            os.kill(process.pid, signum)
        else:
            os.killpg(process.pid, signum)
        if mode == "cleanup":
            deadline = time.monotonic() + server.stop_timeout
            while not server.stopping(run) and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            with contextlib.suppress(ProcessLookupError):  # already done: a fast server may finish first
                os.killpg(process.pid, signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=server.stop_timeout)
        returncode = process.poll()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        watcher.scan()
        watcher.close()
        leftovers = []
        for pid, created in run.pids.items():
            if pid != process.pid and _alive(pid, created):
                with contextlib.suppress(psutil.Error):
                    leftovers.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:200]}")
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)  # never leave them to the next test
    busy = sorted(ports)  # checked by run_case once a target is closed too
    files = sorted(str(path.relative_to(tmp)) for path in tmp.iterdir())
    return Outcome(server, signum, mode, returncode, "\n".join(run.lines), leftovers, busy, files, ready_at_signal,
                   gap, time.monotonic() - started)


def python(*args: str) -> list[str]:
    """This interpreter running a module or script of the repository."""
    return [sys.executable, *args]
