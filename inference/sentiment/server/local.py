"""Start the image's entry point on this machine, from .venv-image (the image's pinned requirements), and stop it.

What `make serve-local` runs, as a context manager for tests and the benchmark: the server in a session of
its own, its output collected (and appended to `log`), `start()` returning once it prints that it serves, and
`stop()` sending the signal SageMaker sends (SIGTERM) and returning the exit status.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from common import processes

ROOT = Path(__file__).resolve().parents[3]
IMAGE_VENV = ROOT / ".venv-image"
IMAGE_PYTHON = IMAGE_VENV / "bin" / "python"
_SERVING = re.compile(r"^serving \S+ at http://[^:]+:(\d+)/invocations")


class ServerError(RuntimeError):
    """The server did not come up; the message says why, with its last output lines."""


class LocalServer:
    def __init__(self, model: str | Path, *, python: Path = IMAGE_PYTHON, port: int = 0, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, log: Path | None = None):
        self.model = Path(model)
        self.python = Path(python)
        self.port = port
        self.args = tuple(args)
        self.env = dict(env or {})
        self.log = log
        self.lines: list[str] = []
        self.process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._serving = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [str(self.python), "-m", "inference.sentiment.server", "serve", "--model-dir", str(self.model),
                "--host", "127.0.0.1", "--port", str(self.port), *self.args]

    def launch(self) -> LocalServer:
        """Start the process and return at once (tests that signal it during start-up use this)."""
        if not self.python.is_file():
            raise ServerError(f"{self.python}: no image venv; run `make image-venv`")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **self.env}
        env.pop("PYTHONPATH", None)
        with processes.deferred_stop_signals():  # so that `stop()` can always reach the child
            self.process = subprocess.Popen(self.command(), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        log = open(self.log, "a") if self.log else None  # noqa: SIM115 (closed below)
        try:
            for line in self.process.stdout:
                self.lines.append(line.rstrip("\n"))
                if log:
                    log.write(line)
                    log.flush()
                match = _SERVING.match(line)
                if match:
                    self.port = int(match.group(1))
                    self._serving.set()
        finally:
            if log:
                log.close()

    def wait_serving(self, timeout: float = 180) -> LocalServer:
        deadline = time.monotonic() + timeout
        while not self._serving.wait(0.1):
            if processes.poll(self.process) is not None:
                time.sleep(0.2)  # let the reader collect the last lines
                raise ServerError(f"the server exited with status {self.process.returncode} before serving:\n"
                                  + "\n".join(self.lines[-20:]))
            if time.monotonic() > deadline:
                raise ServerError(f"not serving within {timeout:.0f} s:\n" + "\n".join(self.lines[-20:]))
        return self

    def start(self, timeout: float = 180) -> LocalServer:
        try:
            return self.launch().wait_serving(timeout)
        except BaseException:
            self.stop()
            raise

    def send_signal(self, signum: int = signal.SIGTERM) -> None:
        if self.process is not None and processes.poll(self.process) is None:
            os.kill(self.process.pid, signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        """Signal the server, wait for it, and make sure its session is gone; returns its exit status."""
        if self.process is None:
            return None
        self.send_signal(signum)
        try:
            status = processes.wait(self.process, timeout)
        except subprocess.TimeoutExpired:
            status = None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # anything the server failed to stop
        if status is None:
            status = processes.wait(self.process, 10)
        if self._reader is not None:
            self._reader.join(5)
        return status

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
