"""One worker process: load the model, then serve the listening socket it inherited until told to drain.

Started by the supervisor (`inference.sentiment.server.__main__`), never by hand. It is born ignoring SIGTERM
and SIGINT (the supervisor sets that before exec): a signal to the whole process group reaches the supervisor,
which decides how each worker stops. Commands arrive on stdin, one per line:

- `drain`: stop accepting, answer every request already accepted (uvicorn's graceful shutdown waits for them,
  then the batcher finishes its queue), exit 0;
- `force`: stop waiting for in-flight requests.
End of stdin (the supervisor is gone, even by SIGKILL) drains too, so no worker outlives it.

uvicorn runs in a thread of its own: there it installs no signal handlers (uvicorn `Server.capture_signals`
does so only in the main thread, and afterwards re-raises the signal, which would end the process by signal
instead of with status 0). The main thread keeps the control channel.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

LOG = logging.getLogger("inference.sentiment.server")


def _report(status_fd: int, message: dict) -> None:
    os.write(status_fd, (json.dumps(message) + "\n").encode())


def run(config, listener: socket.socket, status_fd: int, index: int) -> int:
    import uvicorn

    from inference.sentiment.server import model as models
    from inference.sentiment.server.app import build_app
    from inference.sentiment.server.batcher import Batcher

    loaded = models.load(config.model_dir, threads=config.threads, precision_override=config.precision)
    batcher = Batcher(lambda requests: models.predict(requests, loaded), max_batch_size=config.max_batch_size,
                      max_wait_s=config.max_batch_wait_s, max_queue=config.max_queue,
                      name=f"inference-{index}").start()
    uv_config = uvicorn.Config(
        build_app(loaded, batcher), log_config=None, log_level="warning", access_log=False, lifespan="on", http="h11",
        timeout_keep_alive=60, timeout_graceful_shutdown=config.drain_seconds, backlog=2048,
    )
    server = uvicorn.Server(uv_config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, name="http", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)
    if not thread.is_alive():
        LOG.error("worker %d: the HTTP server did not start", index)
        return 1
    _report(status_fd, {"ready": index, "pid": os.getpid(), "load_seconds": round(loaded.load_seconds, 2),
                        "precision": loaded.precision, "threads": config.threads})
    draining = threading.Event()

    def follow_commands() -> None:
        for line in sys.stdin:
            command = line.strip()
            if command == "force":
                server.force_exit = True
            if command in ("drain", "force"):
                server.should_exit = True
                draining.set()
        server.should_exit = True  # end of stdin: the supervisor is gone
        draining.set()

    threading.Thread(target=follow_commands, name="control", daemon=True).start()
    draining.wait()
    thread.join()
    batcher.stop(timeout=config.drain_seconds)
    stats = batcher.stats
    LOG.info("worker %d stopped: %d requests in %d batches (largest %d texts), %d refused as overloaded",
             index, stats.requests, stats.batches, stats.largest_batch_texts, stats.rejected)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.sentiment.server.worker",
                                     description="One worker of the sentiment server (started by its supervisor).")
    parser.add_argument("--config", required=True, help="the ServerConfig as JSON")
    parser.add_argument("--listen-fd", type=int, required=True, help="the bound socket inherited from the supervisor")
    parser.add_argument("--status-fd", type=int, required=True, help="where to report readiness")
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker-{args.index} %(levelname)s %(message)s")
    from inference.sentiment.server.config import ServerConfig

    values = json.loads(args.config)
    values["model_dir"] = Path(values["model_dir"])
    config = ServerConfig(**values)
    listener = socket.socket(fileno=args.listen_fd)
    try:
        return run(config, listener, args.status_fd, args.index)
    except Exception as error:  # reported to the supervisor as this worker's exit status; one line here
        LOG.error("worker %d failed: %s: %s", args.index, type(error).__name__, error)
        return 3


if __name__ == "__main__":
    status = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalization: torch's thread pools can abort it after a clean stop (see serve.py).
    os._exit(status)
