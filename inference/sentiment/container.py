"""The sentiment container's environment, computed in one place for the CDK stack and the local runs.

No CDK imports: `stacks.sentiment` sets `server_environment` on the endpoint, our server reads it
(`inference/sentiment/server/config.py`) with the same thread formula when a variable is unset, and the toolkit
baseline of `make bench-handler` (`inference.sentiment.local_stack`) sizes its worker threads with it too.

Threads (measured under TorchServe, docs/figures.md): its Java front end accepted, queued and answered requests on
its own threads and needed CPU when requests were cheap (tiny model, 2 cores, 4 clients: 1 intra-op thread gave
1.56x the requests/s of 2). For RoBERTa-base the compute dominates (same set-up: 2 threads gave 1.6-2x the
requests/s of 1), so a small instance gives every vCPU to the model; from 8 vCPUs up, one in eight is kept for the
front end (on our server: its event loop and tokenizer) and the rest shared by the workers.
"""

from __future__ import annotations


def front_end_vcpus(vcpus: int) -> int:
    """vCPUs kept free for the front end (TorchServe's Java one; our server's event loop): one in eight (none below
    8 vCPUs)."""
    return vcpus // 8


def worker_threads(vcpus: int, workers: int) -> int:
    """Intra-op threads per model server worker: what the front end leaves, shared by the workers."""
    if vcpus < 1 or workers < 1:
        raise ValueError(f"vcpus ({vcpus}) and workers ({workers}) must be at least 1")
    return max(1, (vcpus - front_end_vcpus(vcpus)) // workers)


# Our server (inference/sentiment/server): the environment the stack sets on the endpoint and `make serve-local`
# reads with the same defaults (inference/sentiment/server/config.py).
def server_environment(*, vcpus: int, workers: int, max_batch: int, max_batch_size: int, max_batch_wait_ms: int,
                       max_queue: int, precision: str | None = None, max_batch_tokens: int | None = None,
                       max_queue_tokens: int | None = None, request_timeout_ms: int | None = None,
                       drain_seconds: int | None = None, calibration_seconds: int | None = None) -> dict[str, str]:
    """Replicas and threads from `worker_threads` (the front end is the server's event loop and tokenizer, which
    want a share of CPU), batching and queue budgets, the per-request limit, the deadline and drain, the
    precision, the start-up calibration's budget. Unset optional values leave the server's defaults."""
    environment = {
        "SAGEMAKER_MODEL_SERVER_WORKERS": str(workers),
        "OMP_NUM_THREADS": str(worker_threads(vcpus, workers)),
        "MAX_BATCH": str(max_batch),
        "SENTIMENT_MAX_BATCH_SIZE": str(max_batch_size),
        "SENTIMENT_MAX_BATCH_WAIT_MS": str(max_batch_wait_ms),
        "SENTIMENT_MAX_QUEUE": str(max_queue),
        "TORCH_MKLDNN_MATMUL_MIN_DIM": "1024",
    }
    optional = {"SENTIMENT_MAX_BATCH_TOKENS": max_batch_tokens, "SENTIMENT_MAX_QUEUE_TOKENS": max_queue_tokens,
                "SENTIMENT_REQUEST_TIMEOUT_MS": request_timeout_ms, "SENTIMENT_DRAIN_SECONDS": drain_seconds,
                "SENTIMENT_CALIBRATION_SECONDS": calibration_seconds}
    for name, value in optional.items():
        if value is not None:
            environment[name] = str(value)
    if precision:
        environment["SENTIMENT_PRECISION"] = precision
    return environment
