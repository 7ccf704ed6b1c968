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

SIGTERM or Ctrl-C stops TorchServe, its workers and the toolkit (their whole process group), removes the
temporary folder and exits 0.

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

from inference.sentiment.container import container_environment

PROG = "python -m inference.sentiment.local_stack"
ROOT = Path(__file__).resolve().parents[2]
SERVING_VENV = ROOT / ".venv-serving"
SERVING_PYTHON = SERVING_VENV / "bin" / "python"
# The toolkit's entry point with its config file moved out of /etc (it is a module constant there).
_TOOLKIT_ENTRY = """
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
            raise StackError(f"TorchServe already runs here (pid {', '.join(map(str, running))}); the toolkit "
                             "supports one per machine: stop it first")
        self.base = Path(tempfile.mkdtemp(prefix="local-stack-"))
        try:
            extract(self.model, self.base / "model")
            output = open(self.log, "ab") if self.log else None  # noqa: SIM115 (closed below); None: inherit
            try:
                self.process = subprocess.Popen(
                    [str(self.python), "-c", _TOOLKIT_ENTRY, str(self.base / "ts.properties")],
                    cwd=self.base, env=self.environment(), stdout=output, stderr=subprocess.STDOUT if output else None,
                    start_new_session=True,  # its own process group: TorchServe and workers stop with it
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
            if self.process.poll() is not None:
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
        TorchServe stops its workers and exits, then the toolkit exits (about 5 s on 2 cores). Whatever is
        left of the process group after `timeout` (say the toolkit died before installing its handler) gets
        SIGTERM, then SIGKILL.
        """
        if self.process is not None:
            pgid = self.process.pid
            with suppress(ProcessLookupError):
                os.kill(pgid, signal.SIGTERM)
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10), (None, 0)):
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline and _group_alive(pgid, self.process):
                    time.sleep(0.1)
                if sig is None or not _group_alive(pgid, self.process):
                    break
                with suppress(ProcessLookupError):
                    os.killpg(pgid, sig)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
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


def _group_alive(pgid: int, leader: subprocess.Popen) -> bool:
    leader.poll()  # reap the leader so a zombie does not count
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Only zombies left (TorchServe's launcher may leave one until init reaps it)?
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
    return False


class _Stopped(Exception):
    """SIGTERM or SIGINT arrived."""


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
    args = build_parser().parse_args(argv)
    if args.workers < 1 or (args.vcpus is not None and args.vcpus < 1):
        print(f"{PROG}: error: --workers and --vcpus must be at least 1", file=sys.stderr)
        return 2

    def stop(signum, _frame):
        raise _Stopped  # also ends a start-up still waiting for /ping; the finally block cleans up

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stack = LocalStack(args.model, port=args.port, workers=args.workers, vcpus=args.vcpus,
                       max_batch=args.max_batch, quantize=args.quantize, log=args.log)
    try:
        stack.start()
        print(f"serving {args.model} at {stack.url}/invocations (TorchServe + toolkit, "
              f"{args.workers} worker(s), OMP_NUM_THREADS={stack.environment()['OMP_NUM_THREADS']}); "
              "Ctrl-C stops", flush=True)
        while stack.process.poll() is None:
            time.sleep(0.2)
        print(f"{PROG}: error: the stack exited with status {stack.process.returncode}", file=sys.stderr)
        return 1
    except _Stopped:
        pass
    except StackError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the clean-up
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
