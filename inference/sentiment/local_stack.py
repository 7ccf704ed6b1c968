"""Run a model archive under the serving stack of the endpoint's image: TorchServe and the SageMaker toolkit.

What the Graviton image does at start, on this machine: the archive is extracted as SageMaker extracts it into
`/opt/ml/model` (here a temporary `<base>/model`, via the toolkit's `SAGEMAKER_BASE_DIR`), the container
environment is the one `stacks.sentiment` sets (`inference.sentiment.container.container_environment`), and the
toolkit's own entry point (`sagemaker_pytorch_serving_container.serving.main`) writes TorchServe's config,
installs `code/requirements.txt` and starts TorchServe, whose workers import `code/inference.py` through our
`code/sentiment_service.py`. Versions: `inference/sentiment/serving/requirements.txt`, installed by `make serving-stack`
into `.venv-serving/` (Java 17 from Debian when missing).

Differences from the endpoint, all about where things live: TorchServe listens on 127.0.0.1 (inference on
`--port`, management and metrics on free ports) instead of 0.0.0.0:8080; its config goes to a temporary file
instead of `/etc/sagemaker-ts.properties`; its logs go to `<base>/logs`.

Stopping (`common.processes`): SIGTERM or Ctrl-C, to this process or to its process group, once or repeated,
during start-up, while serving or during the clean-up, stops the toolkit, TorchServe and its workers (the toolkit
gets SIGTERM and forwards it to TorchServe; whatever is left after that gets SIGTERM, then SIGKILL), removes the
temporary folder (TorchServe's PID file included) and exits 0 after SIGTERM, 130 after SIGINT. The stack stays in
our process group, so a signal to the group (or a SIGKILL) reaches all of it; it ignores SIGINT itself, so Ctrl-C
stops it in that same order instead of interrupting the toolkit wherever it is. A TorchServe left running by an
earlier crash is named at start with its PID and the command that stops it.

    python -m inference.sentiment.local_stack --model artifacts/model.tar.gz --port 8080
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import suppress
from pathlib import Path

from common import processes
from inference.sentiment.container import container_environment

PROG = "python -m inference.sentiment.local_stack"
ROOT = Path(__file__).resolve().parents[2]
SERVING_VENV = ROOT / ".venv-serving"
SERVING_PYTHON = SERVING_VENV / "bin" / "python"
# The toolkit's entry point with its config file moved out of /etc (it is a module constant there). SIGINT ignored
# (inherited by TorchServe and its workers): Ctrl-C reaches the whole group, and `LocalStack.stop` ends the stack.
_TOOLKIT_ENTRY = """
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
import sys
import sagemaker_pytorch_serving_container.torchserve as torchserve
torchserve.TS_CONFIG_FILE = sys.argv[1]
from sagemaker_pytorch_serving_container import serving
serving.main()
"""


class StackError(RuntimeError):
    """The stack cannot start; the message is for the user."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def extract(archive: Path, model_dir: Path) -> None:
    """A model.tar.gz into model_dir, as SageMaker fills /opt/ml/model; a saved model directory gets our code/."""
    model_dir.mkdir(parents=True)
    if archive.is_dir():
        shutil.copytree(archive, model_dir, dirs_exist_ok=True)
        if not (model_dir / "code").exists():  # a saved model (make train-local): add the code an archive carries
            (model_dir / "code").mkdir()
            for name in ("inference.py", "sentiment_service.py"):
                shutil.copy(ROOT / "inference" / "sentiment" / name, model_dir / "code" / name)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tar:
            tar.extractall(model_dir, filter="data")
    else:
        raise StackError(f"--model {archive}: neither a directory nor a tar archive")
    if not (model_dir / "config.json").is_file() or not (model_dir / "code" / "inference.py").is_file():
        raise StackError(f"--model {archive}: needs config.json and code/inference.py at its root "
                         "(build it with python -m training.package)")


class LocalStack:
    """One TorchServe under the toolkit, on 127.0.0.1; `start()` returns once /ping answers 200."""

    def __init__(self, model: str | Path, *, port: int = 0, workers: int = 1, vcpus: int | None = None,
                 max_batch: int = 64, quantize: str = "none", extra_env: dict[str, str] | None = None,
                 python: Path = SERVING_PYTHON, log: Path | None = None):
        self.model = Path(model)
        self.port = port or free_port()
        self.workers = workers
        self.vcpus = vcpus or len(os.sched_getaffinity(0))
        self.max_batch = max_batch
        self.quantize = quantize
        self.extra_env = dict(extra_env or {})
        self.python = Path(python)
        self.log = log
        self.process: subprocess.Popen | None = None
        self.base: Path | None = None
        self.marker: bytes | None = None  # in the environment of every process of this stack

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        """This process's environment, then the container's (as the stack sets it), then the local placements."""
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the toolkit builds its own from the model's code/ folder
        env.update(container_environment(vcpus=self.vcpus, workers=self.workers, max_batch=self.max_batch,
                                         region=os.environ.get("AWS_REGION", "us-east-1"), quantize=self.quantize))
        env.update({
            "SAGEMAKER_BASE_DIR": str(self.base),
            "SAGEMAKER_BIND_TO_PORT": str(self.port),
            "TS_INFERENCE_ADDRESS": f"http://127.0.0.1:{self.port}",
            "TS_MANAGEMENT_ADDRESS": f"http://127.0.0.1:{free_port()}",
            "TS_METRICS_ADDRESS": f"http://127.0.0.1:{free_port()}",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            # TorchServe's launcher writes its PID file to the temporary directory, Java its model copies to TEMP:
            # both inside the folder that stop() removes, so a stopped stack leaves no file behind.
            "TMPDIR": str(self.base / "tmp"),
            "TEMP": str(self.base / "tmp"),
            "PATH": f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}",  # the toolkit runs `torchserve`
        })
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 180) -> LocalStack:
        if not self.python.is_file():
            raise StackError(f"{self.python}: no serving stack installed; run `make serving-stack`")
        if shutil.which("java") is None:
            raise StackError("no java on PATH; run `make serving-stack` (installs openjdk-17-jre-headless)")
        running = torchserve_pids()
        if running:
            # torchserve.py `_retrieve_ts_server_process` finds TorchServe by command line, machine-wide.
            raise StackError("TorchServe already runs on this machine, and the toolkit supports one per machine: "
                             + "; ".join(processes.describe(pid) for pid in running))
        self.base = Path(tempfile.mkdtemp(prefix="local-stack-"))
        try:
            extract(self.model, self.base / "model")
            (self.base / "tmp").mkdir()
            environment, self.marker = processes.mark(self.environment())
            output = open(self.log, "ab") if self.log else None  # noqa: SIM115 (closed below); None: inherit
            try:
                # In our process group, so a signal to the group or a SIGKILL of it reaches every part of the stack.
                with processes.deferred_stop_signals():  # so that `stop()` can always reach the child
                    self.process = subprocess.Popen(
                        [str(self.python), "-c", _TOOLKIT_ENTRY, str(self.base / "ts.properties")],
                        cwd=self.base, env=environment, stdout=output, stderr=subprocess.STDOUT if output else None,
                    )
            finally:
                if self.log:
                    output.close()
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if processes.poll(self.process) is not None:
                raise StackError(f"the toolkit exited with status {self.process.returncode} before /ping answered"
                                 + (f"; see {self.log}" if self.log else ""))
            with suppress(OSError, http.client.HTTPException):
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                try:
                    connection.request("GET", "/ping")
                    if connection.getresponse().status == 200:
                        return
                finally:
                    connection.close()
            time.sleep(0.25)
        raise StackError(f"/ping did not answer 200 within {timeout:.0f} s")

    def stop(self, timeout: float = 30) -> None:
        """Stop as SageMaker stops the container, then make sure; finally remove the temporary folder.

        SIGTERM goes to the toolkit, which forwards it to TorchServe (torchserve.py `_add_sigterm_handler`):
        TorchServe stops its workers and exits, then the toolkit exits (about 5 s on 2 cores). Whatever of the
        stack is left after `timeout`, or once the toolkit is gone (say it died before installing its handler),
        gets SIGTERM, then SIGKILL (`processes.stop_tree`). No stop signal interrupts this; safe to call again.
        """
        with processes.shielded():
            if self.process is not None:
                processes.stop_tree(self.process, marker=self.marker, grace=timeout)
                self.process = None
            if self.base is not None:
                shutil.rmtree(self.base, ignore_errors=True)
                self.base = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def torchserve_pids() -> list[int]:
    """Live TorchServe front ends on this machine (the toolkit looks for this class on command lines)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                if b"org.pytorch.serve.ModelServer" in (entry / "cmdline").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
    return pids


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", required=True, type=Path,
                        help="a model.tar.gz from training.package, or a saved model directory")
    parser.add_argument("--port", type=int, default=8080, help="inference port on 127.0.0.1")
    parser.add_argument("--workers", type=int, default=1, help="model server workers (the stack's sentiment.workers)")
    parser.add_argument("--vcpus", type=int, default=None,
                        help="vCPUs to size threads for (default: the CPUs this process may use)")
    parser.add_argument("--max-batch", type=int, default=64, help="texts per request (the stack's sentiment.max_batch)")
    parser.add_argument("--quantize", choices=("none", "int8"), default="none",
                        help="dynamic int8 quantization (the stack's sentiment.quantize)")
    parser.add_argument("--log", type=Path, default=None, help="append the stack's output here (default: terminal)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line. Run as a program, the stop handlers are installed before this runs (see the end)."""
    args = build_parser().parse_args(argv)
    if args.workers < 1 or (args.vcpus is not None and args.vcpus < 1):
        print(f"{PROG}: error: --workers and --vcpus must be at least 1", file=sys.stderr)
        return 2
    stack = LocalStack(args.model, port=args.port, workers=args.workers, vcpus=args.vcpus,
                       max_batch=args.max_batch, quantize=args.quantize, log=args.log)
    status = 1
    try:
        print(f"{PROG}: starting TorchServe and the toolkit on port {stack.port} (pid {os.getpid()}); "
              "Ctrl-C or SIGTERM stops", flush=True)
        stack.start()
        print(f"serving {args.model} at {stack.url}/invocations (TorchServe + toolkit, "
              f"{args.workers} worker(s), OMP_NUM_THREADS={stack.environment()['OMP_NUM_THREADS']}); "
              "Ctrl-C stops", flush=True)
        while processes.poll(stack.process) is None:
            time.sleep(0.2)
        print(f"{PROG}: error: the stack exited with status {stack.process.returncode}", file=sys.stderr)
    except processes.Stopped:
        pass
    except StackError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
    finally:
        with processes.shielded():
            if processes.received() is not None:
                print(f"{PROG}: stopping ({signal.Signals(processes.received()).name})", flush=True)
            stack.stop()
    if processes.received() is not None:
        print(f"{PROG}: stopped", flush=True)
        return processes.exit_status(processes.received())
    return status


if __name__ == "__main__":
    processes.install_stop_handlers()  # first: a signal during start-up is handled too
    processes.finish(main())
