"""The server's settings, read once from the environment the stack sets (and overridable on the command line).

Every variable is named here with its default and allowed range, so a bad value stops the server at start with
one line naming it, instead of failing requests later. The stack fills them from `settings.SentimentSettings`
(`inference.sentiment.container.server_environment`); `make serve-local` uses the same defaults.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# SageMaker's hosting contract: the model is extracted here, and the container answers on this port.
SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")
SAGEMAKER_PORT = 8080

MAX_BATCH_SIZE_ENV = "SENTIMENT_MAX_BATCH_SIZE"
MAX_BATCH_WAIT_MS_ENV = "SENTIMENT_MAX_BATCH_WAIT_MS"
MAX_QUEUE_ENV = "SENTIMENT_MAX_QUEUE"
MAX_BATCH_TOKENS_ENV = "SENTIMENT_MAX_BATCH_TOKENS"
MAX_QUEUE_TOKENS_ENV = "SENTIMENT_MAX_QUEUE_TOKENS"
REQUEST_TIMEOUT_MS_ENV = "SENTIMENT_REQUEST_TIMEOUT_MS"
PRECISION_ENV = "SENTIMENT_PRECISION"
DRAIN_SECONDS_ENV = "SENTIMENT_DRAIN_SECONDS"
CALIBRATION_SECONDS_ENV = "SENTIMENT_CALIBRATION_SECONDS"
WORKERS_ENV = "SAGEMAKER_MODEL_SERVER_WORKERS"
THREADS_ENV = "OMP_NUM_THREADS"
PORT_ENV = "SAGEMAKER_BIND_TO_PORT"

# oneDNN's primitive cache and torch's oneDNN (ideep) cache, per worker. Every new input shape (texts x padded
# tokens) adds kernels to both; at their default of 1024 entries a bf16 worker grew without end under varied
# requests (tiny model in-process, 4,000 mixed batches: 519 -> 1014 MiB, still rising), at 32 it stays flat
# (519 -> 550 MiB) with no measurable loss of speed (RoBERTa-base bf16, 8 mixed texts: 170 vs 172 ms).
# The endpoint's environment may set other values.
PRIMITIVE_CACHE_LIMITS = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "32", "LRU_CACHE_CAPACITY": "32"}

DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_MAX_BATCH_WAIT_MS = 5
DEFAULT_MAX_QUEUE = 256
# Tokens, summed over a batch's texts (each truncated to the model's limit): a tweet is 20-60 tokens, so the
# batch budget lets about 32-100 tweets share a pass and keeps a pass of long texts from growing 50x.
DEFAULT_MAX_BATCH_TOKENS = 2048
DEFAULT_MAX_QUEUE_TOKENS = 16384
# SageMaker sends SIGKILL 30 s after SIGTERM (hosting docs, "your-algorithms-inference-code"). The drain waits at
# most DRAIN seconds for accepted requests, and every request's deadline is shorter than the drain, so each
# accepted request is answered (200, or 504 once its deadline passes) before the server exits, within 25 s.
DEFAULT_DRAIN_SECONDS = 22
MAX_DRAIN_SECONDS = 24
DEFAULT_REQUEST_TIMEOUT_MS = 20_000
# The start-up choice of engine and precision on this CPU (inference.sentiment.calibration): its time budget.
DEFAULT_CALIBRATION_SECONDS = 60
MAX_CALIBRATION_SECONDS = 1800


class ConfigError(ValueError):
    """A setting the server cannot start with; the message is one line naming the variable."""


@dataclass(frozen=True)
class ServerConfig:
    """How the server runs: where the model is, where to listen, how to batch, how many replicas (`workers`:
    inference threads in the one server process, SageMaker's SAGEMAKER_MODEL_SERVER_WORKERS) of `threads` each."""

    model_dir: Path = SAGEMAKER_MODEL_DIR
    host: str = "0.0.0.0"  # every interface: SageMaker connects to the container's port
    port: int = SAGEMAKER_PORT
    workers: int = 1
    threads: int = 1
    # Texts gathered from concurrent requests into one forward pass, and how long the first one waits for more.
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_batch_wait_ms: int = DEFAULT_MAX_BATCH_WAIT_MS
    # Texts and tokens of a forward pass at most (a larger request runs alone).
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    # Texts and tokens waiting in the one queue all replicas share; beyond either, a request is answered 429.
    max_queue: int = DEFAULT_MAX_QUEUE
    max_queue_tokens: int = DEFAULT_MAX_QUEUE_TOKENS
    precision: str | None = None  # an override of the model's recorded precision
    drain_seconds: int = DEFAULT_DRAIN_SECONDS
    # A request not started within this is dropped unrun and answered 504; also the bound past which a forward
    # pass counts as stuck (its replica is replaced and /ping fails when none is left).
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    # How long the start-up choice of engine and precision may measure before the best pair so far wins.
    calibration_seconds: int = DEFAULT_CALIBRATION_SECONDS

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("port", self.port, 0, 65535),
            (WORKERS_ENV, self.workers, 1, 256),
            (THREADS_ENV, self.threads, 1, 1024),
            (MAX_BATCH_SIZE_ENV, self.max_batch_size, 1, 1024),
            (MAX_BATCH_WAIT_MS_ENV, self.max_batch_wait_ms, 0, 1000),
            (MAX_QUEUE_ENV, self.max_queue, 1, 100_000),
            (MAX_BATCH_TOKENS_ENV, self.max_batch_tokens, 16, 1_000_000),
            (MAX_QUEUE_TOKENS_ENV, self.max_queue_tokens, 16, 10_000_000),
            (DRAIN_SECONDS_ENV, self.drain_seconds, 1, MAX_DRAIN_SECONDS),
            (REQUEST_TIMEOUT_MS_ENV, self.request_timeout_ms, 100, MAX_DRAIN_SECONDS * 1000 - 1000),
            (CALIBRATION_SECONDS_ENV, self.calibration_seconds, 1, MAX_CALIBRATION_SECONDS),
        ):
            if not low <= value <= high:
                raise ConfigError(f"{name}={value}: must be between {low} and {high}")
        if self.request_timeout_ms >= self.drain_seconds * 1000:
            raise ConfigError(f"{REQUEST_TIMEOUT_MS_ENV}={self.request_timeout_ms}: must be below "
                              f"{DRAIN_SECONDS_ENV} ({self.drain_seconds} s = {self.drain_seconds * 1000} ms), so the "
                              "drain answers every accepted request")
        if self.max_queue_tokens < self.max_batch_tokens:
            raise ConfigError(f"{MAX_QUEUE_TOKENS_ENV}={self.max_queue_tokens}: must be at least "
                              f"{MAX_BATCH_TOKENS_ENV} ({self.max_batch_tokens})")

    @property
    def max_batch_wait_s(self) -> float:
        return self.max_batch_wait_ms / 1000

    @property
    def request_timeout_s(self) -> float:
        return self.request_timeout_ms / 1000


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # honours container CPU sets
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: not an integer") from None


def from_env(env: Mapping[str, str] | None = None, **overrides) -> ServerConfig:
    """The container's settings from `env` (default: this process's), then explicit overrides (the CLI's)."""
    from inference.sentiment.container import worker_threads

    env = os.environ if env is None else env
    workers = overrides.pop("workers", None) or _int(env, WORKERS_ENV, 1)
    if workers < 1:
        raise ConfigError(f"{WORKERS_ENV}={workers}: must be at least 1")
    # One formula for the thread budget (inference/sentiment/container.py), unless the environment names it.
    threads = _int(env, THREADS_ENV, 0) or worker_threads(_usable_cpus(), workers)
    values = {
        "model_dir": Path(env.get("SENTIMENT_MODEL_DIR", "") or SAGEMAKER_MODEL_DIR),
        "port": _int(env, PORT_ENV, SAGEMAKER_PORT),
        "workers": workers,
        "threads": threads,
        "max_batch_size": _int(env, MAX_BATCH_SIZE_ENV, DEFAULT_MAX_BATCH_SIZE),
        "max_batch_wait_ms": _int(env, MAX_BATCH_WAIT_MS_ENV, DEFAULT_MAX_BATCH_WAIT_MS),
        "max_queue": _int(env, MAX_QUEUE_ENV, DEFAULT_MAX_QUEUE),
        "max_batch_tokens": _int(env, MAX_BATCH_TOKENS_ENV, DEFAULT_MAX_BATCH_TOKENS),
        "max_queue_tokens": _int(env, MAX_QUEUE_TOKENS_ENV, DEFAULT_MAX_QUEUE_TOKENS),
        "request_timeout_ms": _int(env, REQUEST_TIMEOUT_MS_ENV, DEFAULT_REQUEST_TIMEOUT_MS),
        "precision": env.get(PRECISION_ENV, "").strip().lower() or None,
        "drain_seconds": _int(env, DRAIN_SECONDS_ENV, DEFAULT_DRAIN_SECONDS),
        "calibration_seconds": _int(env, CALIBRATION_SECONDS_ENV, DEFAULT_CALIBRATION_SECONDS),
    }
    values.update({key: value for key, value in overrides.items() if value is not None})
    return ServerConfig(**values)


def worker_environment(config: ServerConfig) -> dict[str, str]:
    """What the server sets in its own environment before it imports torch: the replicas' thread budget.

    Set before torch loads, so OpenMP and oneDNN size their pools from it. Tokenizers' own thread
    pool is turned off: the texts of a batch are few and short, and its threads would compete with torch's.
    """
    return {
        THREADS_ENV: str(config.threads),
        "MKL_NUM_THREADS": str(config.threads),
        "TOKENIZERS_PARALLELISM": "false",
        **torch_runtime_defaults(),
    }


def torch_runtime_defaults(env: dict[str, str] | None = None) -> dict[str, str]:
    """The OpenMP wait policy and oneDNN cache limits the server runs torch with, unless `env` sets its own.

    The accuracy gate times torch under the same ones (`inference.sentiment.accuracy_check`), so its ranking of torch
    against ONNX Runtime (which has its own thread pool) is the server's.
    """
    env = os.environ if env is None else env
    return {
        # OpenMP's idle threads sleep instead of spinning: the event loop and tokenizer share this process's
        # CPUs with the replicas. Spinning (libgomp's default while its threads fit the CPUs) starved them: tiny
        # model, 1 replica x 2 threads on 2 vCPUs, one client: 172 ms per request, 11.9 ms with PASSIVE.
        "OMP_WAIT_POLICY": env.get("OMP_WAIT_POLICY", "PASSIVE"),
        **{name: env.get(name, limit) for name, limit in PRIMITIVE_CACHE_LIMITS.items()},
    }
