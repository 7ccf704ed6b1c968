"""The image's entry point: `python -m inference.sentiment.server serve` (SageMaker starts the container with `serve`).

A small supervisor binds the port, starts the worker processes (each loads the model and serves the shared
socket, `inference.sentiment.server.worker`), restarts a worker that dies while serving, and stops them all:

- SIGTERM (what SageMaker and `docker stop` send): stop accepting, answer every request already accepted,
  exit 0. SIGINT (Ctrl-C) does the same and exits 130.
- Repeats within a second (GNU make forwards the signal it got, a terminal signals the whole group) count as
  one; a signal a second or more later stops waiting for in-flight requests. During start-up a signal stops
  the workers still loading at once.
- Exit status 1 when a worker cannot start (the log says why), 2 for bad settings.

Settings come from the environment the stack sets (`inference.sentiment.server.config`); options below
override them for local runs. `--model-dir` also takes a `model.tar.gz`, extracted to a temporary folder the
way SageMaker fills /opt/ml/model.

    python -m inference.sentiment.server serve                             # in the image
    python -m inference.sentiment.server serve --model-dir artifacts/model.tar.gz --host 127.0.0.1
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path

from inference.sentiment import precision
from inference.sentiment.server.config import ConfigError, ServerConfig, from_env, worker_environment

PROG = "python -m inference.sentiment.server"
LOG = logging.getLogger("inference.sentiment.server")
ROOT = Path(__file__).resolve().parents[3]  # holds the `inference` package the workers import
REPEAT_WINDOW_S = 1.0
EXIT_STATUS = {signal.SIGTERM: 0, signal.SIGINT: 130}


class StopSignals:
    """Records SIGTERM/SIGINT: the first asks for a drain; one arriving REPEAT_WINDOW_S later forces the stop."""

    def __init__(self):
        self.signum: int | None = None
        self.first_at = 0.0
        self.force = False

    def install(self) -> StopSignals:
        for signum in EXIT_STATUS:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self.first_at = signum, now
        elif now - self.first_at >= REPEAT_WINDOW_S:
            self.force = True

    @property
    def requested(self) -> bool:
        return self.signum is not None


def _born_ignoring_stop_signals() -> None:
    """Runs in the child before exec: ignored signals stay ignored across exec, so the worker never dies of one."""
    for signum in EXIT_STATUS:
        signal.signal(signum, signal.SIG_IGN)


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen
    status_fd: int
    buffer: bytes = b""
    ready: bool = False


class StartupFailed(RuntimeError):
    """A worker exited before it was ready."""


class Supervisor:
    """The listening socket and the workers that share it."""

    def __init__(self, config: ServerConfig):
        self.config = config
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((config.host, config.port))
        except OSError:
            self.listener.close()
            raise
        # Bound, not listening: until a worker has loaded the model, connections are refused rather than queued.
        self.listener.set_inheritable(True)
        self.port = self.listener.getsockname()[1]
        self.workers: dict[int, _Worker] = {}
        self.restarts = 0
        self.ready_info: dict[int, dict] = {}

    def _spawn(self, index: int) -> None:
        read_fd, write_fd = os.pipe()
        config = {**asdict(self.config), "model_dir": str(self.config.model_dir)}
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "inference.sentiment.server.worker", "--config", json.dumps(config),
                 "--listen-fd", str(self.listener.fileno()), "--status-fd", str(write_fd), "--index", str(index)],
                stdin=subprocess.PIPE, pass_fds=(self.listener.fileno(), write_fd), cwd=ROOT,
                env={**os.environ, **worker_environment(self.config)},
                preexec_fn=_born_ignoring_stop_signals,  # safe: the supervisor runs no other threads
            )
        finally:
            os.close(write_fd)
        self.workers[index] = _Worker(index, process, read_fd)

    def start(self) -> None:
        for index in range(self.config.workers):
            self._spawn(index)

    @property
    def all_ready(self) -> bool:
        return all(worker.ready for worker in self.workers.values())

    def poll(self, timeout: float, *, serving: bool) -> None:
        """Read readiness reports; a worker gone before it was ready fails start-up, one gone later restarts."""
        fds = {worker.status_fd: worker for worker in self.workers.values()}
        readable, _, _ = select.select(list(fds), [], [], timeout) if fds else ([], [], [])
        for fd in readable:
            worker = fds[fd]
            chunk = os.read(fd, 4096)
            worker.buffer += chunk
            while b"\n" in worker.buffer:
                line, worker.buffer = worker.buffer.split(b"\n", 1)
                report = json.loads(line)
                worker.ready = True
                self.ready_info[worker.index] = report
        for worker in list(self.workers.values()):
            status = worker.process.poll()
            if status is None:
                continue
            os.close(worker.status_fd)
            del self.workers[worker.index]
            if not worker.ready:
                raise StartupFailed(f"worker {worker.index} exited with status {status} while loading the model")
            if serving:
                LOG.error("worker %d (pid %d) exited with status %s while serving; starting another",
                          worker.index, worker.process.pid, status)
                self.restarts += 1
                self._spawn(worker.index)

    def stop(self, signals: StopSignals) -> None:
        """Drain the ready workers (loading ones are killed: they hold no request), then reap everything."""
        self.listener.close()
        for worker in self.workers.values():
            if worker.ready:
                self._send(worker, "drain")
            else:
                with suppress(ProcessLookupError):
                    worker.process.kill()
        forced = False
        deadline = time.monotonic() + self.config.drain_seconds + 10
        while any(worker.process.poll() is None for worker in self.workers.values()):
            if signals.force and not forced:
                forced = True
                LOG.warning("second signal: no longer waiting for requests in flight")
                for worker in self.workers.values():
                    self._send(worker, "force")
            if time.monotonic() > deadline:
                LOG.error("workers still running %d s after the drain began; killing them",
                          self.config.drain_seconds + 10)
                for worker in self.workers.values():
                    with suppress(ProcessLookupError):
                        worker.process.kill()
                deadline = float("inf")
            time.sleep(0.05)
        for worker in self.workers.values():
            worker.process.wait()
            with suppress(OSError):
                worker.process.stdin.close()
            with suppress(OSError):
                os.close(worker.status_fd)
        self.workers.clear()

    @staticmethod
    def _send(worker: _Worker, command: str) -> None:
        with suppress(BrokenPipeError, OSError, ValueError):
            worker.process.stdin.write(f"{command}\n".encode())
            worker.process.stdin.flush()


def resolve_model(path: Path) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """A model directory as is; a model.tar.gz extracted to a temporary folder (returned, to remove later)."""
    from inference.sentiment.server.model import ModelDirError

    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelDirError(f"--model-dir {path}: no config.json at its root, not a saved model or model archive")
        return path, None
    if not path.exists():
        raise ModelDirError(f"--model-dir {path}: no such file or directory")
    if not tarfile.is_tarfile(path):
        raise ModelDirError(f"--model-dir {path}: neither a directory nor a tar archive")
    workdir = tempfile.TemporaryDirectory(prefix="sentiment-model-")
    with tarfile.open(path) as archive:
        archive.extractall(workdir.name, filter="data")  # refuses absolute paths and links out of the folder
    if not (Path(workdir.name) / "config.json").is_file():
        workdir.cleanup()
        raise ModelDirError(f"--model-dir {path}: no config.json at the archive's root")
    return Path(workdir.name), workdir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the model (what SageMaker runs)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--model-dir", type=Path, default=None,
                       help="a saved model directory or a model.tar.gz "
                            "(default: SENTIMENT_MODEL_DIR, else /opt/ml/model)")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on")
    serve.add_argument("--port", type=int, default=None,
                       help="port (default: SAGEMAKER_BIND_TO_PORT, else 8080; 0: any free port)")
    serve.add_argument("--workers", type=int, default=None,
                       help="worker processes (default: SAGEMAKER_MODEL_SERVER_WORKERS, else 1)")
    serve.add_argument("--max-batch-size", type=int, default=None,
                       help="texts per forward pass across requests (default: SENTIMENT_MAX_BATCH_SIZE, else 32)")
    serve.add_argument("--max-batch-wait-ms", type=int, default=None,
                       help="longest wait for more requests (default: SENTIMENT_MAX_BATCH_WAIT_MS, else 5)")
    serve.add_argument("--max-queue", type=int, default=None,
                       help="texts waiting per worker before 503 (default: SENTIMENT_MAX_QUEUE, else 256)")
    serve.add_argument("--precision", default=None,
                       help="override the model's recorded precision (default: SENTIMENT_PRECISION, else the record)")
    return parser


def _describe(config: ServerConfig, supervisor: Supervisor) -> str:
    first = supervisor.ready_info.get(0, {})
    return (f"{config.workers} worker(s) x {config.threads} thread(s), precision {first.get('precision', '?')}, "
            f"batches up to {config.max_batch_size} texts / {config.max_batch_wait_ms} ms, queue {config.max_queue} "
            f"texts; model loaded in {first.get('load_seconds', '?')} s")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(levelname)s %(message)s")
    signals = StopSignals().install()
    print(f"sentiment server: starting (pid {os.getpid()})", flush=True)
    supervisor = None
    workdir = None
    status = 1
    try:
        config = from_env(workers=args.workers, port=args.port, max_batch_size=args.max_batch_size,
                          max_batch_wait_ms=args.max_batch_wait_ms, max_queue=args.max_queue,
                          precision=args.precision, host=args.host)
        model_dir, workdir = resolve_model((args.model_dir or config.model_dir).absolute())
        config = ServerConfig(**{**asdict(config), "model_dir": model_dir})
        # A refused override stops here, with its figures; else one line says what runs and why (the serving CPU).
        chosen, why = precision.choose_explained(model_dir, config.precision)
        LOG.info("precision %s: %s", chosen, why)
        for name, value in precision.process_environment(chosen).items():
            os.environ.setdefault(name, value)  # the workers inherit it; oneDNN reads it when they import torch
        supervisor = Supervisor(config)
        supervisor.start()
        while not supervisor.all_ready and not signals.requested:
            supervisor.poll(0.05, serving=False)
        if not signals.requested:
            print(f"serving {args.model_dir or config.model_dir} at http://{config.host}:{supervisor.port}/invocations "
                  f"({_describe(config, supervisor)})", flush=True)
        while not signals.requested:
            supervisor.poll(0.1, serving=True)
        status = EXIT_STATUS[signals.signum]
    except (ConfigError, ValueError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        status = 2
    except OSError as error:
        print(f"{PROG}: error: cannot listen on {args.host}:{args.port}: {error.strerror or error}", file=sys.stderr)
        status = 1
    except StartupFailed as error:
        print(f"{PROG}: error: {error}; see the worker's log above", file=sys.stderr)
        status = 1
    finally:
        if signals.requested:
            print("stopping", flush=True)
        if supervisor is not None:
            supervisor.stop(signals)
        if workdir is not None:
            workdir.cleanup()
    if signals.requested:
        status = EXIT_STATUS[signals.signum]
    return status


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
