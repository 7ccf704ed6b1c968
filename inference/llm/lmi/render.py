"""The two output forms of one configuration: serving.properties keys, and the container's environment.

serving.properties is what a model folder in /opt/ml/model carries (alone, naming a hub model, or beside the
weights); the stack passes the environment. They differ only where the container reads them differently:

- the model: in hub mode the environment sets HF_MODEL_ID, from which DJL Serving registers a model at start
  (serving/.../ModelServer.java initModelStore in 0.23, serving/.../util/ModelStore.java from 0.33);
  OPTION_MODEL_ID alone registers nothing while /opt/ml/model is empty. In S3 mode SageMaker fills
  /opt/ml/model, which the model store registers, and option.model_id points there.
- the engine: OPTION_ENGINE selects it from 0.27 only; in 0.23 the MPI launch comes from option.mpi_mode and
  the Python engine is what 0.23 infers for Falcon (see versions.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from inference.llm.lmi.versions import LMI_DIST, VLLM, backend, container
from settings.serving import FalconSettings

MODEL_DIR = "/opt/ml/model"


def render(falcon: FalconSettings) -> dict[str, str]:
    """serving.properties keys for the settings, as the chosen container version reads them."""
    spec = container(falcon.lmi_version)
    chosen = backend(falcon.lmi_version, falcon.batching)
    props = {
        "engine": chosen.engine,
        "option.model_id": MODEL_DIR if falcon.model_s3_uri else falcon.model_id,
    }
    if falcon.model_revision and not falcon.model_s3_uri:
        props["option.revision"] = falcon.model_revision
    props.update({
        "option.tensor_parallel_degree": str(falcon.tensor_parallel_degree),
        "option.dtype": falcon.dtype,
        "option.trust_remote_code": _flag(spec.trust_remote_code),
        "option.model_loading_timeout": str(falcon.model_loading_timeout_s),
        **chosen.properties,
    })
    if falcon.max_concurrent_requests is not None:
        # LMI's MAX_CONCURRENT_REQUESTS is job_queue_size (user_guides/starting-guide.md), which ModelInfo.java
        # reads per model (default 1000, the server's SERVING_JOB_QUEUE_SIZE).
        props["job_queue_size"] = str(falcon.max_concurrent_requests)
    if falcon.batching == "dynamic":
        props["batch_size"] = str(falcon.batch_size)
        props["max_batch_delay"] = str(falcon.max_batch_delay_ms)
        return props
    props["option.max_rolling_batch_size"] = str(falcon.max_rolling_batch_size)
    props["option.max_rolling_batch_prefill_tokens"] = str(falcon.max_rolling_batch_prefill_tokens)
    if chosen.runtime == VLLM:
        max_model_len = falcon.max_input_tokens + falcon.max_new_tokens
        props["option.max_model_len"] = str(max_model_len)
        props["option.gpu_memory_utilization"] = f"{falcon.gpu_memory_utilization:g}"
        if falcon.max_rolling_batch_prefill_tokens < max_model_len:
            props["option.enable_chunked_prefill"] = "true"
        # vLLM pass-through options (user_guides/vllm_user_guide.md, "Advanced vLLM Configurations"): DJL hands
        # an option.X to vLLM when X is one of its EngineArgs (checked in vllm.py).
        if falcon.enable_prefix_caching is not None:
            props["option.enable_prefix_caching"] = _flag(falcon.enable_prefix_caching)
        for item in falcon.vllm_args:
            name, _, value = item.partition("=")
            props["option." + name.strip()] = value.strip()
    if chosen.runtime == LMI_DIST and falcon.output_formatter != "json":
        props["option.output_formatter"] = falcon.output_formatter
    return props


def _flag(value: bool) -> str:
    return "true" if value else "false"


def environment_name(key: str) -> str:
    """The environment variable DJL Serving reads for a serving.properties key (OPTION_X, SERVING_X)."""
    if key == "engine":
        return "OPTION_ENGINE"
    if key.startswith("option."):
        return "OPTION_" + key.removeprefix("option.").upper()
    return "SERVING_" + key.upper()


def to_environment(falcon: FalconSettings, props: Mapping[str, str] | None = None) -> dict[str, str]:
    """The container environment that means the same as render(falcon) in that container version."""
    props = render(falcon) if props is None else props
    spec = container(falcon.lmi_version)
    environment: dict[str, str] = {}
    for key, value in props.items():
        if key == "engine" and not spec.engine_from_environment:
            continue  # 0.23: the engine is inferred first; MPI comes from option.mpi_mode
        if key == "option.model_id" and not falcon.model_s3_uri:
            environment["HF_MODEL_ID"] = value
            continue
        environment[environment_name(key)] = value
    return environment


def to_properties_file(props: Mapping[str, str]) -> str:
    lines = ["# Rendered by `python -m inference.llm.lmi render`. Put it in the model folder (/opt/ml/model): beside",
             "# the weights, or alone when option.model_id names a Hugging Face model."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"
