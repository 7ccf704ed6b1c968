"""Serve the handler over HTTP with the SageMaker container's contract, so the endpoint can be tried offline.

A light server for quick tries; `make serve-local` (`inference.sentiment.local_stack`) runs the endpoint's real stack.
`GET /ping` answers 200 once the model is loaded; `POST /invocations` hands each request to the SageMaker
toolkit's own request path (`sagemaker_inference.transformer.Transformer.transform`, through the archive's
`code/sentiment_service.py`, as TorchServe does), so decoding, status codes and error bodies cannot drift from
the endpoint's. What differs: one Python process instead of TorchServe's Java front end and workers, so
latencies are lower than the endpoint's; measure speed with `make bench-handler`. The handler is loaded the way
the container loads it: `<model dir>/code/inference.py` when the archive carries one, else this repository's
`inference/sentiment/inference.py`. `--model-dir` takes a saved model directory or a `model.tar.gz`.

SIGTERM or Ctrl-C, to the process or its group, once or repeated, while the model loads or while serving, stops
it (`common.processes`): the port is closed, an extracted archive removed, and it exits 0 after SIGTERM, 130
after SIGINT.

    python -m inference.sentiment.serve --model-dir artifacts/model.tar.gz --port 8080
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import signal
import sys
import tarfile
import tempfile
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

from common import processes

LOG = logging.getLogger("inference.sentiment.serve")
PROG = "python -m inference.sentiment.serve"
# SageMaker real-time endpoints take at most 6 MB per request; refuse more before reading it.
MAX_BODY_BYTES = 6 * 1024 * 1024
JSON = "application/json"


class ModelDirError(ValueError):
    """A --model-dir that holds no model; printed as one line, exit status 2."""


def resolve_model_dir(path: str | Path) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """The directory to load from, extracting a `model.tar.gz` into a temporary one (returned to clean up)."""
    path = Path(path)
    if not path.exists():
        raise ModelDirError(f"--model-dir {path}: no such file or directory")
    workdir = None
    if path.is_file():
        if not tarfile.is_tarfile(path):
            raise ModelDirError(f"--model-dir {path}: neither a directory nor a tar archive")
        workdir = tempfile.TemporaryDirectory(prefix="model-")
        with tarfile.open(path) as archive:
            archive.extractall(workdir.name, filter="data")  # refuses absolute paths and links out of the dir
        path = Path(workdir.name)
    if not (path / "config.json").is_file():
        if workdir:
            workdir.cleanup()
        raise ModelDirError(f"--model-dir {path}: no config.json at its root, not a saved model or model archive")
    return path, workdir


def _load_model_code(model_dir: Path, name: str, fallback: str) -> ModuleType:
    """`code/<name>.py` from the model directory, as the container imports it, else the repository's module."""
    shipped = model_dir / "code" / f"{name}.py"
    if not shipped.is_file():
        return importlib.import_module(fallback)
    spec = importlib.util.spec_from_file_location(f"model_code_{name}_{abs(hash(str(shipped)))}", shipped)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def load_handler_module(model_dir: Path) -> ModuleType:
    """`code/inference.py` from the model directory, else the repository's."""
    return _load_model_code(model_dir, "inference", "inference.sentiment.inference")


def load_service_module(model_dir: Path) -> ModuleType:
    """`code/sentiment_service.py` from the model directory, else the repository's."""
    return _load_model_code(model_dir, "sentiment_service", "inference.sentiment.sentiment_service")


class _Context:
    """The parts of TorchServe's request context the toolkit's Transformer reads and writes."""

    model_name = "model"

    def __init__(self, model_dir: Path, content_type: str | None, accept: str | None):
        headers = {}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if accept is not None:
            headers["Accept"] = accept
        self.system_properties = {"model_dir": str(model_dir)}
        self.request_processor = [types.SimpleNamespace(get_request_properties=lambda: headers)]
        self.status = 200
        self.content_type = None

    def set_response_status(self, code, phrase=None, idx=0):
        self.status = int(code)

    def set_response_content_type(self, idx, value):
        self.content_type = value


def _error_body(status: int, message: str) -> bytes:
    return (json.dumps({"error": message, "status": status}) + "\n").encode()


class Handler:
    """The four hooks around one loaded model; `invoke` never raises, like the toolkit's transform."""

    def __init__(self, model_dir: str | Path):
        self.model_dir, self._workdir = resolve_model_dir(model_dir)
        try:
            self.module = load_handler_module(self.model_dir)
            for hook in ("model_fn", "input_fn", "predict_fn", "output_fn"):
                if not callable(getattr(self.module, hook, None)):
                    raise ModelDirError(f"{self.module.__file__}: no {hook}()")
            started = time.perf_counter()
            self.model = self.module.model_fn(str(self.model_dir))
            self.load_seconds = time.perf_counter() - started
            self.transformer = self._transformer()
        except BaseException:  # a bad model, or a stop signal while loading: no extracted archive left behind
            self.close()
            raise
        # One request at a time: torch already spreads each forward pass over every thread it was given.
        self._lock = threading.Lock()

    def _transformer(self):
        """The archive's SentimentTransformer, set up as its `validate_and_initialize` would for this module.

        The toolkit imports the handler by module name (`inference`), which here is this repository's package;
        so the loaded module's hooks are bound directly, looked up per call (tests may replace one).
        """
        from sagemaker_inference import environment

        transformer = load_service_module(self.model_dir).SentimentTransformer()
        transformer._environment = environment.Environment()
        transformer._model = self.model
        transformer._input_fn = lambda body, content_type: self.module.input_fn(body, content_type)
        transformer._predict_fn = lambda data, model: self.module.predict_fn(data, model)
        transformer._output_fn = lambda prediction, accept: self.module.output_fn(prediction, accept)
        transformer._transform_fn = transformer._default_transform_fn
        transformer._initialized = True
        return transformer

    def invoke(self, body: bytes, content_type: str | None, accept: str | None) -> tuple[int, bytes, str]:
        """(status, body, content type) for one request, from the toolkit's `Transformer.transform`."""
        context = _Context(self.model_dir, content_type, accept)
        with self._lock:
            response = self.transformer.transform([{"body": body}], context)[0]
        if isinstance(response, str):
            response = response.encode()
        return context.status, response, context.content_type or JSON

    def close(self) -> None:
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so load tests measure the model rather than TCP set-up
    # Headers and body go out in two writes; without TCP_NODELAY the second waits ~40 ms for a delayed ACK.
    disable_nagle_algorithm = True
    server: ModelServer

    def do_GET(self):
        if self.path.split("?")[0] == "/ping":
            self._send(200, b"{\"status\": \"healthy\"}\n", JSON)
        else:
            self._send(404, _error_body(404, f"no route GET {self.path}; try /ping"), JSON)

    def do_POST(self):
        if self.path.split("?")[0] != "/invocations":
            self._discard_body()
            self._send(404, _error_body(404, f"no route POST {self.path}; try /invocations"), JSON)
            return
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            self._send(411, _error_body(411, "send a Content-Length; chunked bodies are not supported"), JSON)
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._send(400, _error_body(400, "bad Content-Length"), JSON)
            return
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(413, _error_body(413, f"request body over {MAX_BODY_BYTES} bytes"), JSON)
            return
        body = self.rfile.read(length)
        status, response, content_type = self.server.handler.invoke(
            body, self.headers.get("Content-Type"), self.headers.get("Accept")
        )
        self._send(status, response, content_type)

    def _discard_body(self):
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = 0
        if 0 < length <= MAX_BODY_BYTES:
            self.rfile.read(length)
        elif length:
            self.close_connection = True

    def _send(self, status: int, body: bytes, content_type: str):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        LOG.info('%s "%s" %d %d bytes %.1f ms', self.address_string(), self.requestline, status, len(body),
                 (time.perf_counter() - self._started) * 1000)

    def handle_one_request(self):
        self._started = time.perf_counter()
        super().handle_one_request()

    def log_request(self, code="-", size="-"):
        pass  # `_send` writes one line per request, with the latency

    def log_message(self, format, *args):
        LOG.warning("%s %s", self.address_string(), format % args)


class ModelServer(ThreadingHTTPServer):
    """An HTTP server holding one loaded `Handler`; `server_close` also removes an extracted archive."""

    daemon_threads = True

    def __init__(self, handler: Handler, address: tuple[str, int]):
        self.handler = handler
        super().__init__(address, _RequestHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def server_close(self):
        super().server_close()
        self.handler.close()


def make_server(model_dir: str | Path, host: str = "127.0.0.1", port: int = 8080) -> ModelServer:
    """Load the model, then bind (port 0: any free port); call `serve_forever()` on the result."""
    handler = Handler(model_dir)
    try:
        return ModelServer(handler, (host, port))
    except OSError:
        handler.close()
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Serve the sentiment handler locally with the SageMaker contract: GET /ping, POST /invocations.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model-dir", required=True, help="a saved model directory or a model.tar.gz")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (0: any free port)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line. Run as a program, the stop handlers are installed before this runs (see the end)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    server = None
    try:
        LOG.info("loading the model from %s (pid %d); Ctrl-C or SIGTERM stops", args.model_dir, os.getpid())
        try:
            server = make_server(args.model_dir, args.host, args.port)
        except ModelDirError as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 2
        except OSError as error:
            print(f"{PROG}: error: cannot listen on {args.host}:{args.port}: {error.strerror or error}",
                  file=sys.stderr)
            return 1
        LOG.info("model from %s loaded in %.1f s (handler %s, %d threads); listening on %s",
                 args.model_dir, server.handler.load_seconds, server.handler.module.__file__,
                 getattr(server.handler.model, "threads", 0), server.url)
        server.serve_forever()
    except processes.Stopped as stopped:
        LOG.info("stopping (%s)", signal.Signals(stopped.signum).name)
    finally:
        with processes.shielded():
            if server is not None:
                server.server_close()
    if processes.received() is not None:
        LOG.info("stopped")
        return processes.exit_status(processes.received())
    return 0


if __name__ == "__main__":
    # First, so a signal while the model loads is handled too. The first one raises `Stopped` in the main thread,
    # which leaves serve_forever (shutdown() from a handler would deadlock); later ones are ignored.
    processes.install_stop_handlers()
    status = main()
    # Skip interpreter finalization: with torch's thread pools and daemon request threads still around it
    # could abort (SIGABRT, exit -6) on a busy machine after a clean stop.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
