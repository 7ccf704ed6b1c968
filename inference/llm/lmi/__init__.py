"""The Falcon recipe's LMI (DJL Serving) configuration: rendered once, checked before any deploy.

The recipe's lesson is that batching and memory settings decide a 10x difference in throughput, and that wrong
ones fail only at endpoint start, after a long and paid wait. So everything that can be known before deploy is
computed here, in plain Python (no aws_cdk, no SDK, no network), and used by the stack, the tests and the CLI.

One file per concern: hardware (GPUs per instance type), models (the architecture catalogue), versions (what each
LMI release does, read from DJL Serving's source), render (serving.properties and environment), sizing (memory per
engine), rules (every check), images, cli.
"""

from inference.llm.lmi.hardware import GIB, GPU_INSTANCES, Gpu, gpu_instance, has_local_nvme
from inference.llm.lmi.images import image_uri, repository_arn
from inference.llm.lmi.models import (
    CATALOGUE,
    MODELS,
    Architecture,
    CatalogueModel,
    architecture,
    from_config,
    kv_bytes_per_token,
    kv_bytes_per_token_split_by_heads,
    kv_bytes_per_token_split_by_layers,
)
from inference.llm.lmi.render import MODEL_DIR, environment_name, render, to_environment, to_properties_file
from inference.llm.lmi.requests import details_supported, request_body, streaming_request_body
from inference.llm.lmi.rules import (
    check,
    check_batching_keys,
    check_concurrency,
    check_engine_is_known_on_023,
    check_engine_settings,
    check_health_check_covers_loading,
    check_hf_token,
    check_mode_in_version,
    check_prefill_holds_a_prompt,
    check_revision_is_for_the_hub,
    check_tensor_parallel,
    check_timeouts,
)
from inference.llm.lmi.sizing import MIN_HEADROOM, RESERVE_GIB, SizingReport, check_memory, sizing
from inference.llm.lmi.versions import (
    DEFAULT_VERSION,
    IMAGE_TAGS,
    REPOSITORY,
    VERSIONS,
    Backend,
    Bundle,
    ContainerVersion,
    backend,
    container,
)
from inference.llm.lmi.vllm import check_prefix_caching, check_vllm_args, check_vllm_engine

__all__ = [
    "CATALOGUE",
    "DEFAULT_VERSION",
    "GIB",
    "GPU_INSTANCES",
    "IMAGE_TAGS",
    "MIN_HEADROOM",
    "MODELS",
    "MODEL_DIR",
    "REPOSITORY",
    "RESERVE_GIB",
    "VERSIONS",
    "Architecture",
    "Backend",
    "Bundle",
    "CatalogueModel",
    "ContainerVersion",
    "Gpu",
    "SizingReport",
    "architecture",
    "backend",
    "check",
    "check_batching_keys",
    "check_concurrency",
    "check_engine_is_known_on_023",
    "check_engine_settings",
    "check_health_check_covers_loading",
    "check_hf_token",
    "check_memory",
    "check_mode_in_version",
    "check_prefill_holds_a_prompt",
    "check_prefix_caching",
    "check_revision_is_for_the_hub",
    "check_tensor_parallel",
    "check_timeouts",
    "check_vllm_args",
    "check_vllm_engine",
    "container",
    "details_supported",
    "environment_name",
    "from_config",
    "gpu_instance",
    "has_local_nvme",
    "image_uri",
    "kv_bytes_per_token",
    "kv_bytes_per_token_split_by_heads",
    "kv_bytes_per_token_split_by_layers",
    "render",
    "repository_arn",
    "request_body",
    "sizing",
    "streaming_request_body",
    "to_environment",
    "to_properties_file",
]
