"""A pytest plugin (`-p tests.stop_signals` in pyproject.toml): a stopped run still stops every server a test started.

Tests start real servers and tools and stop them in their fixtures' teardown, which pytest runs when a test is
interrupted by KeyboardInterrupt. Under pytest-xdist the tests run in worker processes, so:

- Ctrl-C in a terminal reaches every process of the group: the controller and each worker get SIGINT at once. A
  CI time-out (or `kill`) sends SIGTERM to the controller alone, whose default action would end it and leave the
  workers to xdist's shutdown, which kills a busy worker after 10 s, before its teardown has run.
- So the controller turns SIGTERM and SIGINT into one SIGINT to each worker and ignores any further stop signal;
  each worker raises KeyboardInterrupt on its first SIGINT or SIGTERM and ignores the rest, so a second signal (the
  terminal's and the controller's, or an impatient second Ctrl-C) cannot cut its teardown short.
- The workers end their session as interrupted, xdist sees that and stops the run: pytest's exit status 2.

Without xdist (`-n 0`, `-p no:xdist`) the one process behaves like a worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _interrupt_once(signum, frame) -> None:
    _ignore_stop_signals()
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def _children() -> list[int]:
    """This process's direct children (xdist's workers), read from /proc: no dependency the 3.13 venv lacks."""
    me = os.getpid()
    children = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            children.append(int(entry.name))
    return children


def _forward_to_workers(signum, frame) -> None:
    _ignore_stop_signals()
    for pid in _children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)


def pytest_configure(config) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    is_controller = getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")
    handler = _forward_to_workers if is_controller else _interrupt_once
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
