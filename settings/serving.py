"""The two endpoints: sentiment on Graviton, Falcon on LMI."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from settings.errors import SettingsError
from settings.fields import SageMakerInstanceType, section, setting, text

# LMI releases whose DJL Serving source was read (inference/llm/lmi/versions.py says what each one does).
LMI_VERSIONS = ("0.23.0", "0.33.0", "0.35.0", "0.36.0")


@section
class SentimentSettings:
    """The Graviton endpoint for the fine-tuned model (images and instance sizes in stacks/sentiment.py)."""

    enabled: bool = setting(False, description="deploy the sentiment endpoint")
    model_data_url: text(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+\.tar\.gz$", "an s3:// URI of a model.tar.gz"
                         ) | None = setting(None, description="the trained model archive (needed when enabled)")
    instance_type: SageMakerInstanceType = setting("ml.c7g.4xlarge", description="endpoint instance type")
    pytorch_version: Literal["2.4.0", "2.6.0"] = setting("2.6.0", description="PyTorch Graviton inference image")
    min_instances: int = setting(1, ge=1, le=20, description="endpoint instances at least")
    max_instances: int = setting(2, ge=1, le=20, description="endpoint instances at most (autoscaling)")
    workers: int = setting(2, ge=1, le=64, description="model server workers per instance")
    max_batch: int = setting(64, ge=1, le=1024, description="texts per request at most")
    invocations_per_instance: int = setting(600, ge=1, le=100000, unit="per minute",
                                            description="autoscaling target per instance")
    latency_alarm_ms: int = setting(1000, ge=1, le=60000, unit="ms", description="model latency alarm threshold")
    canary_percent: int = setting(10, ge=1, le=50, unit="%", description="blue/green canary share of the fleet")
    bake_minutes: int = setting(10, ge=1, le=60, unit="minutes", description="blue/green wait watched by alarms")
    autoscaling: bool = setting(True, description="target tracking between min and max instances; turn off to "
                                                  "change instance_type (README, Updating)")
    quantize: Literal["none", "int8"] = setting("none", description="int8 Linear layers at load (check accuracy)")

    @model_validator(mode="after")
    def _consistent(self) -> SentimentSettings:
        if self.enabled and not self.model_data_url:
            raise SettingsError("sentiment.model_data_url", self.model_data_url,
                                "an s3://.../model.tar.gz URI when sentiment.enabled is true")
        if self.max_instances < self.min_instances:
            raise SettingsError("sentiment.max_instances", self.max_instances,
                                f"at least sentiment.min_instances ({self.min_instances})")
        return self


@section
class FalconSettings:
    """The Falcon recipe's LMI deployment; cross-checks against GPUs and container live in inference.llm.lmi."""

    enabled: bool = setting(False, description="deploy the Falcon LMI endpoint")
    model_id: text(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$", "a Hugging Face model id such as tiiuae/falcon-40b"
                   ) = setting("tiiuae/falcon-40b", description="model to serve")
    model_s3_uri: text(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+/$", "an s3:// prefix ending in /") | None = setting(
        None, description="uncompressed weights served from /opt/ml/model, not the hub")
    model_revision: text(r"^[A-Za-z0-9][\w.-]{0,99}$", "a Hugging Face revision: a commit hash, tag or branch name"
                         ) | None = setting(None, description="hub revision to download; none: main")
    instance_type: SageMakerInstanceType = setting("ml.g5.48xlarge", description="endpoint instance type")
    tensor_parallel_degree: Literal[1, 2, 4, 8] = setting(8, description="GPUs the model is split across")
    dtype: Literal["fp16", "bf16"] = setting("fp16", description="weight precision")
    lmi_version: Literal[LMI_VERSIONS] = setting("0.33.0", description="LMI (DJL Serving) container release")
    batching: Literal["dynamic", "rolling", "rolling_paged"] = setting("rolling_paged", description="batching mode")
    batch_size: int = setting(4, ge=1, le=64, description="dynamic batching: requests per batch")
    max_batch_delay_ms: int = setting(100, ge=1, le=10000, unit="ms", description="dynamic batching: batch wait")
    max_rolling_batch_size: int = setting(32, ge=1, le=1024, description="continuous batching: sequences at once")
    max_rolling_batch_prefill_tokens: int = setting(1024, ge=16, le=1048576, unit="tokens",
                                                    description="continuous batching: prefill budget")
    max_input_tokens: int = setting(1024, ge=1, le=131072, unit="tokens", description="prompt length at most")
    max_new_tokens: int = setting(256, ge=1, le=131072, unit="tokens", description="generated tokens at most")
    gpu_memory_utilization: float = setting(0.9, ge=0.5, le=0.98,
                                            description="vLLM's share of each GPU (LMI 0.33+ continuous batching)")
    output_formatter: Literal["json", "jsonlines"] = setting("json", description="LMI 0.23 streaming format")
    model_loading_timeout_s: int = setting(1800, ge=60, le=3600, unit="s", description="LMI model loading timeout")
    startup_health_check_timeout_s: int = setting(3600, ge=60, le=3600, unit="s",
                                                  description="SageMaker container start-up health check timeout")
    download_timeout_s: int = setting(3600, ge=60, le=3600, unit="s", description="SageMaker model download timeout")
    min_instances: int = setting(1, ge=1, le=10, description="endpoint instances at least")
    max_instances: int = setting(1, ge=1, le=10, description="endpoint instances at most")
    model_layers: int | None = setting(None, ge=1, le=1000, description="a model outside the catalogue: layers")
    model_attention_heads: int | None = setting(None, ge=1, le=1024, description="... attention heads")
    model_kv_heads: int | None = setting(None, ge=1, le=1024, description="... key/value heads")
    model_head_dim: int | None = setting(None, ge=1, le=4096, description="... head dimension")
    model_parameters_billion: float | None = setting(None, ge=0.001, le=10000, unit="billion",
                                                     description="... parameters")

    @model_validator(mode="after")
    def _instances(self) -> FalconSettings:
        if self.max_instances < self.min_instances:
            raise SettingsError("falcon.max_instances", self.max_instances,
                                f"at least falcon.min_instances ({self.min_instances})")
        return self
