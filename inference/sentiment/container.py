"""The sentiment container's environment, computed in one place for the CDK stack and the local serving stack.

No CDK imports: `inference.sentiment.local_stack` runs the archive under
TorchServe and the SageMaker toolkit with exactly
what `stacks.sentiment.SentimentStack` sets on the endpoint.

Threads (measured on the real stack, docs/figures.md): TorchServe's Java front end accepts, queues
and answers requests on its own threads and needs CPU when requests are cheap (tiny model, 2 cores, 4 clients:
1 intra-op thread gave 1.56x the requests/s of 2). For RoBERTa-base the compute dominates (same set-up: 2 threads
gave 1.6-2x the requests/s of 1), so a small instance gives every vCPU to the worker; from 8 vCPUs up, one in
eight is kept for the front end and the rest shared by the workers.
"""

from __future__ import annotations

# Our handler service (`code/sentiment_service.py` in the archive, written by training.package). TorchServe
# reads `TS_<property>` environment variables over its config file because the toolkit's default-ts.properties
# sets `enable_envvars_config=true` (sagemaker-pytorch-inference 2.0.25,
# src/sagemaker_pytorch_serving_container/etc/default-ts.properties); the toolkit itself writes
# `default_service_handler=<its handler_service>:handle` (torchserve.py `_generate_ts_config_properties`).
SERVICE_MODULE = "sentiment_service"
SERVICE_HANDLER_ENV = "TS_DEFAULT_SERVICE_HANDLER"
SERVICE_HANDLER = f"{SERVICE_MODULE}:handle"


def front_end_vcpus(vcpus: int) -> int:
    """vCPUs kept free for TorchServe's Java front end: one in eight (none below 8 vCPUs)."""
    return vcpus // 8


def worker_threads(vcpus: int, workers: int) -> int:
    """Intra-op threads per model server worker: what the front end leaves, shared by the workers."""
    if vcpus < 1 or workers < 1:
        raise ValueError(f"vcpus ({vcpus}) and workers ({workers}) must be at least 1")
    return max(1, (vcpus - front_end_vcpus(vcpus)) // workers)


def container_environment(*, vcpus: int, workers: int, max_batch: int, region: str,
                          quantize: str = "none") -> dict[str, str]:
    """The handler's contract, our handler service, the thread budget and the Graviton tuning of the AWS images."""
    return {
        "SAGEMAKER_PROGRAM": "inference.py",
        # Ignored by sagemaker-pytorch-inference 2.0.25 (it imports from /opt/ml/model/code); kept for older ones.
        "SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code",
        "SAGEMAKER_CONTAINER_LOG_LEVEL": "20",
        "SAGEMAKER_REGION": region,
        "SAGEMAKER_MODEL_SERVER_WORKERS": str(workers),
        SERVICE_HANDLER_ENV: SERVICE_HANDLER,
        "OMP_NUM_THREADS": str(worker_threads(vcpus, workers)),
        "MAX_BATCH": str(max_batch),
        "SENTIMENT_QUANTIZE": quantize,
        "DNNL_DEFAULT_FPMATH_MODE": "BF16",
        "LRU_CACHE_CAPACITY": "1024",
        "THP_MEM_ALLOC_ENABLE": "1",
        "TORCH_MKLDNN_MATMUL_MIN_DIM": "1024",
    }


# Our server (sentiment.runtime=server, inference/sentiment/server): the environment the stack sets on the
# endpoint and `make serve-local` reads with the same defaults (inference/sentiment/server/config.py).
def server_environment(*, vcpus: int, workers: int, max_batch: int, max_batch_size: int, max_batch_wait_ms: int,
                       max_queue: int, precision: str | None = None, max_batch_tokens: int | None = None,
                       max_queue_tokens: int | None = None, request_timeout_ms: int | None = None,
                       drain_seconds: int | None = None) -> dict[str, str]:
    """Replicas and threads from the same formula as the TorchServe path (its front end is now the server's event
    loop and tokenizer, which also want a share of CPU), batching and queue budgets, the per-request limit, the
    deadline and drain, the precision. Unset optional values leave the server's defaults."""
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
                "SENTIMENT_REQUEST_TIMEOUT_MS": request_timeout_ms, "SENTIMENT_DRAIN_SECONDS": drain_seconds}
    for name, value in optional.items():
        if value is not None:
            environment[name] = str(value)
    if precision:
        environment["SENTIMENT_PRECISION"] = precision
    return environment
