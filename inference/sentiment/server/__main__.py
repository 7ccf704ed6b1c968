"""The image's entry point: `python -m inference.sentiment.server serve` (SageMaker starts the container with `serve`).

One process: it loads the model, starts the model replicas (inference threads sharing the weights, fed by one
admission queue: `inference.sentiment.server.batcher`) and serves HTTP with uvicorn in a thread of its own (there
uvicorn installs no signal handlers: `Server.capture_signals` does so only in the main thread). The main thread
keeps the signals and the replicas' watchdog. How it stops:

- SIGTERM (what SageMaker and `docker stop` send): stop accepting, answer every request already accepted, exit 0
  within the drain (SENTIMENT_DRAIN_SECONDS, at most 24 s: SageMaker sends SIGKILL 30 s after SIGTERM). Every
  request's deadline is shorter than the drain, so each accepted request gets its answer (200, or 504).
  SIGINT (Ctrl-C) does the same and exits 130.
- Repeats within a second (GNU make forwards the signal it got, a terminal signals the whole group) count as
  one; a signal a second or more later stops waiting for requests in flight. A signal during start-up stops at
  once (nothing is accepted before the model is loaded: the port is bound but not listening until then).
- Exit status 1 when the model cannot be loaded or the port is taken (the log says why), 2 for bad settings.

Settings come from the environment the stack sets (`inference.sentiment.server.config`); options below
override them for local runs. `--model-dir` also takes a `model.tar.gz`, extracted to a temporary folder the
way SageMaker fills /opt/ml/model.

    python -m inference.sentiment.server serve                             # in the image
    python -m inference.sentiment.server serve --model-dir artifacts/model.tar.gz --host 127.0.0.1
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from inference.sentiment import precision
from inference.sentiment.server.config import ConfigError, ServerConfig, from_env, worker_environment

PROG = "python -m inference.sentiment.server"
LOG = logging.getLogger("inference.sentiment.server")
REPEAT_WINDOW_S = 1.0
EXIT_STATUS = {signal.SIGTERM: 0, signal.SIGINT: 130}


class StopSignals:
    """Records SIGTERM/SIGINT: the first asks for a drain; one arriving REPEAT_WINDOW_S later forces the stop."""

    def __init__(self):
        self.signum: int | None = None
        self.first_at = 0.0
        self.force = False
        self.event = threading.Event()

    def install(self) -> StopSignals:
        for signum in EXIT_STATUS:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self.first_at = signum, now
            self.event.set()
        elif now - self.first_at >= REPEAT_WINDOW_S:
            self.force = True

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout`, waking on the first signal (the handler runs in the main thread between waits)."""
        return self.event.wait(timeout)


class StartupFailed(RuntimeError):
    """The model could not be loaded or the HTTP server did not start."""


def bind(config: ServerConfig) -> socket.socket:
    """The listening socket, bound at once (a taken port fails fast) but listening only once uvicorn serves, so
    until the model is loaded connections are refused rather than queued."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto says TCP
    # (asyncio base_events `_set_nodelay`); without it each response's body waits for the client's delayed ACK of
    # its headers, about 40 ms per request (measured: 56 vs 12 ms for one tiny-model request).
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((config.host, config.port))
    except OSError:
        listener.close()
        raise
    return listener


class Server:
    """The model, its replicas and queue, and uvicorn serving them."""

    def __init__(self, config: ServerConfig, listener: socket.socket):
        self.config = config
        self.listener = listener
        self.loaded = None
        self.batcher = None
        self.http = None
        self._thread: threading.Thread | None = None

    def load(self) -> None:
        """Load and warm the model, then start the replicas (runs in a thread: a signal can end start-up)."""
        from inference.sentiment.server import model as models
        from inference.sentiment.server.batcher import Batcher

        config = self.config
        self.loaded = loaded = models.load(config.model_dir, threads=config.threads,
                                           precision_override=config.precision, replicas=config.workers,
                                           calibration_seconds=config.calibration_seconds)

        def run_batch(items):
            return models.predict(items, loaded)

        def restart(index: int):
            models.warm_up(loaded)  # the shared model still answers; raises (and is retried) if not
            return run_batch

        self.batcher = Batcher(
            run_batch, replicas=config.workers, restart=restart, max_batch_size=config.max_batch_size,
            max_batch_tokens=config.max_batch_tokens, max_wait_s=config.max_batch_wait_s, max_queue=config.max_queue,
            max_queue_tokens=config.max_queue_tokens, timeout_s=config.request_timeout_s,
            stuck_after_s=config.request_timeout_s, name="replica").start()

    def serve(self) -> None:
        import uvicorn

        from inference.sentiment.server.app import build_app

        self.http = uvicorn.Server(uvicorn.Config(
            build_app(self.loaded, self.batcher), log_config=None, log_level="warning", access_log=False,
            lifespan="off", http="h11", timeout_keep_alive=60, timeout_graceful_shutdown=self.config.drain_seconds,
            backlog=2048,
        ))
        self._thread = threading.Thread(target=self.http.run, kwargs={"sockets": [self.listener]}, name="http",
                                        daemon=True)
        self._thread.start()
        while not self.http.started and self._thread.is_alive():
            time.sleep(0.01)
        if not self._thread.is_alive():
            raise StartupFailed("the HTTP server did not start")

    def drain(self, signals: StopSignals) -> None:
        """Stop accepting, answer what was accepted (within the drain), stop the replicas."""
        started = time.monotonic()
        budget = self.config.drain_seconds
        if self.http is not None:
            self.http.should_exit = True  # uvicorn closes the listener and idle connections, waits for the rest
            forced = False
            while self._thread.is_alive() and time.monotonic() - started < budget + 0.5:
                if signals.force and not forced:
                    forced = True
                    LOG.warning("second signal: no longer waiting for requests in flight")
                    self.http.force_exit = True
                self._thread.join(0.05)
        if self.batcher is not None:
            left = self.batcher.fail_queued(RuntimeError("the server stopped before the request ran"))
            self.batcher.stop(timeout=max(0.1, budget + 0.5 - (time.monotonic() - started)))
            stats = self.batcher.stats
            LOG.info("stopped after %.1f s: %d requests in %d batches (largest %d texts), %d refused as overloaded, "
                     "%d past their deadline, %d cancelled, %d replica restarts (%d failed attempts)%s",
                     time.monotonic() - started, stats.requests, stats.batches, stats.largest_batch_texts,
                     stats.rejected, stats.expired, stats.cancelled, stats.restarts, stats.failed_restarts,
                     f"; {left} queued requests dropped" if left else "")


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
                       help="model replicas: inference threads sharing the weights "
                            "(default: SAGEMAKER_MODEL_SERVER_WORKERS, else 1)")
    serve.add_argument("--max-batch-size", type=int, default=None,
                       help="texts per forward pass across requests (default: SENTIMENT_MAX_BATCH_SIZE, else 32)")
    serve.add_argument("--max-batch-tokens", type=int, default=None,
                       help="tokens per forward pass (default: SENTIMENT_MAX_BATCH_TOKENS, else 2048)")
    serve.add_argument("--max-batch-wait-ms", type=int, default=None,
                       help="longest wait for more requests (default: SENTIMENT_MAX_BATCH_WAIT_MS, else 5)")
    serve.add_argument("--max-queue", type=int, default=None,
                       help="texts waiting in the queue before 429 (default: SENTIMENT_MAX_QUEUE, else 256)")
    serve.add_argument("--max-queue-tokens", type=int, default=None,
                       help="tokens waiting in the queue before 429 (default: SENTIMENT_MAX_QUEUE_TOKENS, else 16384)")
    serve.add_argument("--request-timeout-ms", type=int, default=None,
                       help="a request's deadline; later it is answered 504 (default: SENTIMENT_REQUEST_TIMEOUT_MS, "
                            "else 20000)")
    serve.add_argument("--drain-seconds", type=int, default=None,
                       help="longest wait for accepted requests after SIGTERM (default: SENTIMENT_DRAIN_SECONDS, "
                            "else 22; at most 24)")
    serve.add_argument("--precision", default=None,
                       help="serve this (engine, precision) pair instead of the fastest one measured here, if it "
                            f"answers like fp32 on this CPU: one of {', '.join(precision.PRECISIONS)} (onnx-*: ONNX "
                            "Runtime; default: SENTIMENT_PRECISION, else the calibration's choice)")
    serve.add_argument("--calibration-seconds", type=int, default=None,
                       help="longest the start-up choice of engine and precision may measure before the best pair "
                            "so far wins (default: SENTIMENT_CALIBRATION_SECONDS, else 60)")
    return parser


def _describe(config: ServerConfig, server: Server) -> str:
    return (f"{config.workers} replica(s) x {config.threads} thread(s) in one process, precision "
            f"{server.loaded.precision}, batches up to {config.max_batch_size} texts / {config.max_batch_tokens} "
            f"tokens / {config.max_batch_wait_ms} ms, one queue of {config.max_queue} texts / "
            f"{config.max_queue_tokens} tokens, deadline {config.request_timeout_s:g} s, drain {config.drain_seconds} "
            f"s; model loaded in {server.loaded.load_seconds:.2f} s")


class _StoppedDuringStartup(Exception):
    pass


def _set_torch_environment(config: ServerConfig) -> None:
    """The replicas' thread budget into this process's environment, before anything imports torch: OpenMP and
    oneDNN read it once, when torch loads them. oneDNN's math mode is not set here: the calibration sets each
    pair's at run time (`precision.activate`), and the one pair served keeps its own."""
    os.environ.update(worker_environment(config))
    if "torch" in sys.modules:  # a bug: the variables would not take effect
        LOG.warning("torch was imported before the server set its environment; thread settings may not apply")
    names = sorted(worker_environment(config))
    LOG.info("environment for torch: %s", ", ".join(f"{name}={os.environ[name]}" for name in names))


def _load(server: Server, signals: StopSignals) -> None:
    """Load in a thread, so a signal during start-up stops at once (os._exit ends the loader)."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            server.load()
        except BaseException as error:  # reported below, in the main thread
            failure.append(error)

    loader = threading.Thread(target=target, name="load", daemon=True)
    loader.start()
    while loader.is_alive():
        if signals.requested:
            raise _StoppedDuringStartup
        signals.wait(0.05)
        loader.join(0.0)
    if failure:
        error = failure[0]
        if isinstance(error, ValueError):
            raise error
        raise StartupFailed(f"the model could not be loaded: {type(error).__name__}: {error}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s server %(levelname)s %(message)s")
    signals = StopSignals().install()
    print(f"sentiment server: starting (pid {os.getpid()})", flush=True)
    server = None
    listener = None
    workdir = None
    status = 1
    try:
        config = from_env(workers=args.workers, port=args.port, max_batch_size=args.max_batch_size,
                          max_batch_tokens=args.max_batch_tokens, max_batch_wait_ms=args.max_batch_wait_ms,
                          max_queue=args.max_queue, max_queue_tokens=args.max_queue_tokens,
                          request_timeout_ms=args.request_timeout_ms, drain_seconds=args.drain_seconds,
                          precision=args.precision, host=args.host,
                          calibration_seconds=args.calibration_seconds)
        model_dir, workdir = resolve_model((args.model_dir or config.model_dir).absolute())
        config = ServerConfig(**{**asdict(config), "model_dir": model_dir})
        if config.precision:  # a name that is no pair stops here; whether the pair answers like fp32, at load
            precision.parse_override(config.precision)
        _set_torch_environment(config)
        listener = bind(config)
        server = Server(config, listener)
        _load(server, signals)
        if not signals.requested:
            server.serve()
            port = listener.getsockname()[1]
            print(f"serving {args.model_dir or config.model_dir} at http://{config.host}:{port}/invocations "
                  f"({_describe(config, server)})", flush=True)
        while not signals.requested:
            signals.wait(0.5)
            if not server._thread.is_alive():
                raise StartupFailed("the HTTP server stopped unexpectedly")
        status = EXIT_STATUS[signals.signum]
    except _StoppedDuringStartup:
        server = None  # nothing was accepted: no drain
    except (ConfigError, ValueError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        status = 2
    except OSError as error:
        print(f"{PROG}: error: cannot listen on {args.host}:{args.port}: {error.strerror or error}", file=sys.stderr)
        status = 1
    except StartupFailed as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        status = 1
    finally:
        if signals.requested:
            print("stopping", flush=True)
        if server is not None:
            server.drain(signals)
        if listener is not None:
            listener.close()
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
    # Skip interpreter finalization: torch's thread pools can abort it after a clean stop (see serve.py), and a
    # replica stuck in a forward pass must not hold the exit.
    os._exit(code)
