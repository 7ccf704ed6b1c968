"""The toolkit baseline of `make bench-handler`: a model archive under TorchServe and the SageMaker PyTorch toolkit.

What a user of AWS's PyTorch inference image got, run on this machine: the stack of the retired Graviton image
(`pytorch-inference-arm64:2.6`, `sentiment.runtime=dlc` until issue 43) with the toolkit's own handler service,
importing the archive's `code/inference.py` (for the baseline: `serving/hf_default_handler.py`, a transformers
`pipeline` per request). The archive is extracted as SageMaker extracts it into `/opt/ml/model` (here a temporary
`<base>/model`, via the toolkit's `SAGEMAKER_BASE_DIR`), the environment is the one that image's stack set
(`toolkit_environment`), and the toolkit's own entry point (`sagemaker_pytorch_serving_container.serving.main`)
writes TorchServe's config and starts TorchServe. Versions: `inference/sentiment/serving/requirements.txt`,
installed by `make serving-stack` into `.venv-serving/` (Java 17 from Debian when missing), which
`make bench-handler` runs first; nothing else installs it.

Differences from that image, all about where things live: TorchServe listens on 127.0.0.1 (inference on a free
port, management and metrics on others) instead of 0.0.0.0:8080; its config goes to a temporary file instead of
`/etc/sagemaker-ts.properties`; its logs go to `<base>/logs`.

Stopping (`common.processes`): `stop()` sends SIGTERM to the toolkit, which forwards it to TorchServe; whatever is
left gets SIGTERM, then SIGKILL, and the temporary folder (TorchServe's PID file included) is removed. The stack
stays in our process group, so a signal to the group (or a SIGKILL) reaches all of it; it ignores SIGINT itself, so
Ctrl-C stops it through `stop()` instead of interrupting the toolkit wherever it is. The toolkit allows one
TorchServe per machine: a second start names the one that runs, with its PID and the command that stops it.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from contextlib import suppress
from pathlib import Path

from common import processes
from inference.sentiment.container import worker_threads

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


def toolkit_environment(*, vcpus: int, workers: int, region: str) -> dict[str, str]:
    """What the retired image's stack set for the toolkit (its handler contract, workers and their threads) and the
    Graviton tuning AWS's image sets; no handler service of ours, so the toolkit's own default one runs."""
    return {
        "SAGEMAKER_PROGRAM": "inference.py",
        # Ignored by sagemaker-pytorch-inference 2.0.25 (it imports from /opt/ml/model/code); kept for older ones.
        "SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code",
        "SAGEMAKER_CONTAINER_LOG_LEVEL": "20",
        "SAGEMAKER_REGION": region,
        "SAGEMAKER_MODEL_SERVER_WORKERS": str(workers),
        "OMP_NUM_THREADS": str(worker_threads(vcpus, workers)),
        "DNNL_DEFAULT_FPMATH_MODE": "BF16",
        "LRU_CACHE_CAPACITY": "1024",
        "THP_MEM_ALLOC_ENABLE": "1",
        "TORCH_MKLDNN_MATMUL_MIN_DIM": "1024",
    }


def extract(archive: Path, model_dir: Path) -> None:
    """A model.tar.gz into model_dir, as SageMaker fills /opt/ml/model (a directory laid out alike is copied)."""
    model_dir.mkdir(parents=True)
    if archive.is_dir():
        shutil.copytree(archive, model_dir, dirs_exist_ok=True)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tar:
            tar.extractall(model_dir, filter="data")
    else:
        raise StackError(f"{archive}: neither a directory nor a tar archive")
    if not (model_dir / "config.json").is_file() or not (model_dir / "code" / "inference.py").is_file():
        raise StackError(f"{archive}: needs config.json and code/inference.py at its root (build it with "
                         "python -m training.package --handler ...)")


class LocalStack:
    """One TorchServe under the toolkit, on 127.0.0.1; `start()` returns once /ping answers 200."""

    def __init__(self, model: str | Path, *, port: int = 0, workers: int = 1, vcpus: int | None = None,
                 python: Path = SERVING_PYTHON, log: Path | None = None):
        self.model = Path(model)
        self.port = port or free_port()
        self.workers = workers
        self.vcpus = vcpus or len(os.sched_getaffinity(0))
        self.python = Path(python)
        self.log = log
        self.process: subprocess.Popen | None = None
        self.base: Path | None = None
        self.marker: bytes | None = None  # in the environment of every process of this stack

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        """This process's environment, then the container's (as the image's stack set it), then the local placements."""
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the toolkit builds its own from the model's code/ folder
        env.update(toolkit_environment(vcpus=self.vcpus, workers=self.workers,
                                       region=os.environ.get("AWS_REGION", "us-east-1")))
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
        return env

    def start(self, timeout: float = 180) -> LocalStack:
        if not self.python.is_file():
            raise StackError(f"{self.python}: no TorchServe stack installed; run `make serving-stack` (make "
                             "bench-handler does)")
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
