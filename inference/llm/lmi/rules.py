"""Rules: each raises SettingsError naming the setting, the value and the real reason; check() runs them all."""

from __future__ import annotations

import dataclasses

from inference.llm.lmi.hardware import gpu_instance
from inference.llm.lmi.models import CATALOGUE, architecture, from_config_file
from inference.llm.lmi.sizing import check_memory
from inference.llm.lmi.versions import LMI_DIST, VLLM, backend, container
from inference.llm.lmi.vllm import check_prefix_caching, check_vllm_args, check_vllm_engine
from settings import SettingsError
from settings.serving import FalconSettings

TIMEOUT_RANGE = (60, 3600)
_DEFAULTS = dataclasses.asdict(FalconSettings())
_ROLLING_KEYS = ("max_rolling_batch_size", "max_rolling_batch_prefill_tokens")
_DYNAMIC_KEYS = ("batch_size", "max_batch_delay_ms")


def check_timeouts(falcon: FalconSettings) -> None:
    """SageMaker accepts start-up health check and download timeouts of 60-3600 s; loading must fit in them."""
    low, high = TIMEOUT_RANGE
    for name in ("model_loading_timeout_s", "startup_health_check_timeout_s", "download_timeout_s"):
        value = getattr(falcon, name)
        if not low <= value <= high:
            raise SettingsError(f"falcon.{name}", value, f"{low} to {high} seconds (SageMaker's limits)")


def check_health_check_covers_loading(falcon: FalconSettings) -> None:
    if falcon.startup_health_check_timeout_s < falcon.model_loading_timeout_s:
        raise SettingsError(
            "falcon.startup_health_check_timeout_s", falcon.startup_health_check_timeout_s,
            f"at least falcon.model_loading_timeout_s ({falcon.model_loading_timeout_s}): SageMaker would stop "
            "the container while the model is still loading")


def check_batching_keys(falcon: FalconSettings) -> None:
    """Dynamic batching and rolling batch are exclusive: a setting of the other mode is a mistake, not a no-op."""
    dynamic = falcon.batching == "dynamic"
    foreign = _ROLLING_KEYS if dynamic else _DYNAMIC_KEYS
    for name in foreign:
        value = getattr(falcon, name)
        if value != _DEFAULTS[name]:
            own = " and ".join(f"falcon.{n}" for n in (_DYNAMIC_KEYS if dynamic else _ROLLING_KEYS))
            raise SettingsError(
                f"falcon.{name}", value,
                f"no change with falcon.batching={falcon.batching} (dynamic batching and rolling batch are "
                f"mutually exclusive; this mode reads {own})")


def check_mode_in_version(falcon: FalconSettings) -> None:
    backend(falcon.lmi_version, falcon.batching)


def check_engine_settings(falcon: FalconSettings) -> None:
    """gpu_memory_utilization is vLLM's, output_formatter is 0.23 lmi-dist's: elsewhere nothing reads them."""
    runtime = backend(falcon.lmi_version, falcon.batching).runtime
    if falcon.gpu_memory_utilization != _DEFAULTS["gpu_memory_utilization"] and runtime != VLLM:
        raise SettingsError(
            "falcon.gpu_memory_utilization", falcon.gpu_memory_utilization,
            f"no change with {falcon.batching} batching on lmi_version {falcon.lmi_version}: only vLLM (rolling_paged "
            f"on 0.33.0 and later) reads it; {runtime} has no memory share")
    if falcon.output_formatter != _DEFAULTS["output_formatter"] and runtime != LMI_DIST:
        raise SettingsError(
            "falcon.output_formatter", falcon.output_formatter,
            f"json with {falcon.batching} batching on lmi_version {falcon.lmi_version}: only 0.23.0's rolling batch "
            "reads option.output_formatter (0.33+ streams per request with \"stream\": true)")


def check_revision_is_for_the_hub(falcon: FalconSettings) -> None:
    if falcon.model_revision and falcon.model_s3_uri:
        raise SettingsError(
            "falcon.model_revision", falcon.model_revision,
            "no revision with falcon.model_s3_uri: the container serves what the S3 prefix holds")


def check_engine_is_known_on_023(falcon: FalconSettings) -> None:
    """0.23 infers the engine from the model's config.json before it reads OPTION_ENGINE (LmiUtils.java), and its
    transformers (4.30.2) and lmi-dist were read for Falcon only: 0.23 serves the recipe's Falcon models."""
    if container(falcon.lmi_version).engine_from_environment:
        return
    if falcon.model_id in CATALOGUE and not falcon.model_config and CATALOGUE[falcon.model_id].model_type == "falcon":
        return
    falcons = ", ".join(sorted(m for m, a in CATALOGUE.items() if a.model_type == "falcon"))
    raise SettingsError(
        "falcon.model_id", falcon.model_id,
        f"a Falcon catalogue model ({falcons}) with lmi_version {falcon.lmi_version}: it picks the engine from the "
        "model's config.json before it reads OPTION_ENGINE, and only Falcon's path through 0.23 was read; use "
        "0.33.0 or later for other models")


def check_concurrency(falcon: FalconSettings) -> None:
    """MAX_CONCURRENT_REQUESTS (job_queue_size) "should be greater than or equal to MAX_BATCH_SIZE"
    (serving/docs/lmi/user_guides/starting-guide.md): a smaller queue cannot fill the batch."""
    if falcon.max_concurrent_requests is None:
        return
    batch_setting = "batch_size" if falcon.batching == "dynamic" else "max_rolling_batch_size"
    batch = getattr(falcon, batch_setting)
    if falcon.max_concurrent_requests < batch:
        raise SettingsError("falcon.max_concurrent_requests", falcon.max_concurrent_requests,
                            f"at least falcon.{batch_setting} ({batch}): LMI queues requests up to this number, so a "
                            "smaller one never fills a batch")


def check_hf_token(falcon: FalconSettings) -> None:
    """The token is for hub downloads; LMI 0.23 prints every HF_* variable at start, the token too
    (serving/.../util/ConfigManager.java dumpConfigurations at 0.23.0-dlc; 0.33+ print HF_TOKEN as ***)."""
    if falcon.hf_token_secret is None:
        return
    if falcon.model_s3_uri:
        raise SettingsError("falcon.hf_token_secret", falcon.hf_token_secret,
                            "unset with falcon.model_s3_uri: the container reads the weights from /opt/ml/model and "
                            "never asks the hub")
    if not container(falcon.lmi_version).engine_from_environment:
        raise SettingsError("falcon.hf_token_secret", falcon.hf_token_secret,
                            f"unset with lmi_version {falcon.lmi_version}: it logs HF_TOKEN in plain text at start "
                            "(ConfigManager.java); stage the weights in S3 instead (python -m inference.llm.lmi stage)")


def check_prefill_holds_a_prompt(falcon: FalconSettings) -> None:
    """Without chunked prefill a prompt is prefilled in one step, so the prefill budget must hold a whole one."""
    if falcon.batching == "dynamic" or backend(falcon.lmi_version, falcon.batching).runtime == VLLM:
        return
    if falcon.max_rolling_batch_prefill_tokens < falcon.max_input_tokens:
        raise SettingsError(
            "falcon.max_rolling_batch_prefill_tokens", falcon.max_rolling_batch_prefill_tokens,
            f"at least falcon.max_input_tokens ({falcon.max_input_tokens}): LMI {falcon.lmi_version} has no chunked "
            "prefill, so a longer prompt cannot be scheduled")


def check_tensor_parallel(falcon: FalconSettings) -> None:
    """At most the GPU count; for true tensor parallelism (lmi-dist, vLLM) a divisor of the heads.

    In dynamic mode the degree only says over how many GPUs accelerate places whole layers.
    """
    _, gpus = gpu_instance(falcon.instance_type)
    tp = falcon.tensor_parallel_degree
    if tp > gpus:
        raise SettingsError("falcon.tensor_parallel_degree", tp,
                            f"at most {gpus}, the GPU count of one {falcon.instance_type}")
    arch = architecture(falcon)
    if falcon.batching == "dynamic":
        return
    divisors = [d for d in (1, 2, 4, 8) if d <= gpus and arch.attention_heads % d == 0]
    if arch.attention_heads % tp:
        raise SettingsError("falcon.tensor_parallel_degree", tp,
                            f"a divisor of the {arch.attention_heads} attention heads of {falcon.model_id} "
                            f"({', '.join(map(str, divisors))} here)")
    if arch.kv_heads % tp and tp % arch.kv_heads:
        raise SettingsError("falcon.tensor_parallel_degree", tp,
                            f"a divisor or multiple of the {arch.kv_heads} KV heads of {falcon.model_id}")


def config_names_another_model(falcon: FalconSettings) -> list[str]:
    """falcon.model_config sizes and checks the model; a catalogue model_id of another type then deploys a model the
    checks never saw (sizing one config file alone, with model_id left at its default, is fine)."""
    if not falcon.model_config or falcon.model_id not in CATALOGUE:
        return []
    config_type = from_config_file(falcon.model_config).model_type
    catalogue_type = CATALOGUE[falcon.model_id].model_type
    if config_type == catalogue_type:
        return []
    return [f"falcon.model_config is a {config_type or 'model without model_type'} config.json, but falcon.model_id "
            f"{falcon.model_id} is a {catalogue_type} model: the checks used the config file, the endpoint would "
            "serve model_id; set falcon.model_id to the config's model"]


def check(falcon: FalconSettings) -> list[str]:
    """Every rule, cheapest first; raises SettingsError on the first failure, returns warnings."""
    check_timeouts(falcon)
    check_health_check_covers_loading(falcon)
    check_batching_keys(falcon)
    check_mode_in_version(falcon)
    check_engine_settings(falcon)
    check_revision_is_for_the_hub(falcon)
    check_engine_is_known_on_023(falcon)
    check_prefill_holds_a_prompt(falcon)
    check_tensor_parallel(falcon)
    check_concurrency(falcon)
    check_hf_token(falcon)
    check_prefix_caching(falcon)
    check_vllm_args(falcon)
    check_vllm_engine(falcon)
    warnings = check_memory(falcon)
    warnings += config_names_another_model(falcon)
    if not falcon.model_s3_uri and not falcon.model_revision:
        warnings.append(f"falcon.model_revision is not set: the container downloads whatever {falcon.model_id}'s "
                        "main branch holds at start; pin a commit hash for repeatable deploys")
    return warnings
