"""The two endpoints: sentiment on Graviton, Falcon on LMI."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from settings.fields import SageMakerInstanceType, SettingsError, s3_uri_pattern, s3_uri_problem, section, setting, text

# LMI releases offered (inference/llm/lmi/versions.py says what each one does and what was checked). 0.36.0 names
# two images (lmi27, lmi28), so the 0.36 and later releases carry their LMI number.
LMI_VERSIONS = ("0.23.0", "0.33.0", "0.35.0", "0.36.0-lmi27", "0.36.0-lmi28", "0.38.0-lmi29")

# S3 locations, described in words, and when refused, what is wrong (`_s3_location`).
ARCHIVE_WORDS = "an s3:// URI of a model.tar.gz"
PREFIX_WORDS = "an s3:// prefix ending in /"
ModelArchive = text(s3_uri_pattern(".tar.gz"), ARCHIVE_WORDS)
S3Prefix = text(s3_uri_pattern("/"), PREFIX_WORDS)
HubModelId = text(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$", "a Hugging Face model id such as tiiuae/falcon-40b")
# A Secrets Manager secret name, or its ARN.
SecretName = text(r"^(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:)?[A-Za-z0-9/_+=.@-]{1,512}$",
                  "a Secrets Manager secret name or ARN")
ConfigJsonPath = text(r"^\S+\.json$", "a path to a model's config.json file")
HubRevision = text(r"^[A-Za-z0-9][\w.-]{0,99}$", "a Hugging Face revision: a commit hash, tag or branch name")


def _s3_location(key: str, value: object, key_ending: str, words: str) -> object:
    """A refused S3 location's error says what is wrong with it, not only what is allowed."""
    if isinstance(value, str) and (problem := s3_uri_problem(value.strip(), key_ending)):
        raise SettingsError(key, value, f"{words} ({problem})")
    return value


# Graviton2 (Neoverse N1) hosting families: no bf16 instructions, so the server runs them in fp32 (or int8), never
# bf16 (inference/sentiment/cpu_features.py). Graviton3 (c7g) and Graviton4 (c8g) have them.
NO_BF16_FAMILIES = ("c6g", "m6g", "r6g")


@section
class SentimentSettings:
    """The Graviton endpoint for the fine-tuned model, on our serving image (stacks/sentiment.py)."""

    enabled: bool = setting(False, "deploy the sentiment endpoint")
    model_data_url: ModelArchive | None = setting(None, "the trained model archive (needed when enabled)")
    instance_type: SageMakerInstanceType = setting("ml.c7g.4xlarge", "endpoint instance type")
    min_instances: int = setting(1, "endpoint instances at least", ge=1, le=20)
    max_instances: int = setting(2, "endpoint instances at most (autoscaling)", ge=1, le=20)
    workers: int = setting(2, "model server workers per instance (our server: inference threads sharing the model)",
                           ge=1, le=64)
    max_batch: int = setting(64, "texts per request at most", ge=1, le=1024)
    invocations_per_instance: int = setting(600, "autoscaling target per instance", ge=1, le=100000, unit="per minute")
    latency_alarm_ms: int = setting(1000, "model latency alarm threshold", ge=1, le=60000, unit="ms")
    canary_percent: int = setting(10, "blue/green canary share of the fleet", ge=1, le=50, unit="%")
    bake_minutes: int = setting(10, "blue/green wait watched by alarms", ge=1, le=60, unit="minutes")
    autoscaling: bool = setting(True, "target tracking; off to change instance_type (docs/updating.md)")
    max_batch_size: int = setting(32, "our server: texts gathered into one forward pass", ge=1, le=1024)
    max_batch_tokens: int = setting(2048, "our server: tokens gathered into one forward pass", ge=16, le=1_000_000,
                                    unit="tokens")
    max_batch_wait_ms: int = setting(5, "our server: longest wait for a batch to fill", ge=0, le=1000, unit="ms")
    max_queue: int = setting(256, "our server: texts waiting in its one queue before 429", ge=1, le=100000,
                             unit="texts")
    max_queue_tokens: int = setting(16384, "our server: tokens waiting in its one queue before 429", ge=16,
                                    le=10_000_000, unit="tokens")
    request_timeout_ms: int = setting(20_000, "our server: a request's deadline, then 504 (below drain_seconds)",
                                      ge=100, le=23_000, unit="ms")
    drain_seconds: int = setting(22, "our server: longest wait for accepted requests after SIGTERM (SIGKILL at 30 s)",
                                 ge=1, le=24, unit="s")
    precision: Literal["fp32", "bf16", "int8", "onnx-fp32", "onnx-int8", "onnx-bf16-fastmath"] | None = setting(
        None, "serve this engine and precision instead of the start-up choice, if it answers like fp32 on the "
              "serving CPU (onnx-*: ONNX Runtime; bf16 and onnx-bf16-fastmath need c7g or c8g)")
    calibration_seconds: int = setting(60, "our server: longest the start-up choice of engine and precision may "
                                           "measure on the serving CPU (RoBERTa-base: 9 s on 2 Xeon vCPUs)",
                                       ge=5, le=1800, unit="s")
    image_scan_on_push: bool = setting(True, "ECR scan on push for the CDK asset repositories (one per registry)")

    @field_validator("model_data_url", mode="before")
    @classmethod
    def _archive(cls, value: object) -> object:
        return _s3_location("sentiment.model_data_url", value, ".tar.gz", ARCHIVE_WORDS)

    @model_validator(mode="after")
    def _consistent(self) -> SentimentSettings:
        family = self.instance_type.split(".")[1] if self.instance_type.count(".") == 2 else ""
        if self.precision in ("bf16", "onnx-bf16-fastmath") and family.startswith(NO_BF16_FAMILIES):
            raise SettingsError("sentiment.precision", self.precision,
                                f"fp32, int8, onnx-fp32 or onnx-int8 on {self.instance_type} (Graviton2 has no bf16 "
                                f"instructions), or unset: the server then chooses among those; {self.precision} "
                                "needs a c7g or c8g instance type")
        if self.max_queue < self.max_batch:
            raise SettingsError("sentiment.max_queue", self.max_queue,
                                f"at least sentiment.max_batch ({self.max_batch}): a full request must fit")
        if self.max_queue_tokens < self.max_batch_tokens:
            raise SettingsError("sentiment.max_queue_tokens", self.max_queue_tokens,
                                f"at least sentiment.max_batch_tokens ({self.max_batch_tokens})")
        if self.request_timeout_ms >= self.drain_seconds * 1000:
            raise SettingsError("sentiment.request_timeout_ms", self.request_timeout_ms,
                                f"below sentiment.drain_seconds ({self.drain_seconds} s = {self.drain_seconds * 1000} "
                                "ms), so the drain answers every accepted request")
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

    enabled: bool = setting(False, "deploy the Falcon LMI endpoint")
    model_id: HubModelId = setting("tiiuae/falcon-40b", "model to serve")
    model_s3_uri: S3Prefix | None = setting(None, "uncompressed weights served from /opt/ml/model, not the hub")
    model_revision: HubRevision | None = setting(None, "hub revision to download; none: main")
    instance_type: SageMakerInstanceType = setting("ml.g5.48xlarge", "endpoint instance type")
    tensor_parallel_degree: Literal[1, 2, 4, 8] = setting(8, "GPUs the model is split across")
    dtype: Literal["fp16", "bf16"] = setting("fp16", "weight precision")
    lmi_version: Literal[LMI_VERSIONS] = setting("0.36.0-lmi27", "LMI (DJL Serving) container release")
    batching: Literal["dynamic", "rolling", "rolling_paged"] = setting("rolling_paged", "batching mode")
    batch_size: int = setting(4, "dynamic batching: requests per batch", ge=1, le=64)
    max_batch_delay_ms: int = setting(100, "dynamic batching: batch wait", ge=1, le=10000, unit="ms")
    max_rolling_batch_size: int = setting(32, "continuous batching: sequences at once", ge=1, le=1024)
    max_rolling_batch_prefill_tokens: int = setting(1024, "continuous batching: prefill budget", ge=16, le=1048576,
                                                    unit="tokens")
    max_input_tokens: int = setting(1024, "prompt length at most", ge=1, le=131072, unit="tokens")
    max_new_tokens: int = setting(256, "generated tokens at most", ge=1, le=131072, unit="tokens")
    gpu_memory_utilization: float = setting(0.9, "vLLM's share of each GPU (LMI 0.33+)", ge=0.5, le=0.98)
    output_formatter: Literal["json", "jsonlines"] = setting("json", "LMI 0.23 streaming format")
    model_loading_timeout_s: int = setting(1800, "LMI model loading timeout", ge=60, le=3600, unit="s")
    startup_health_check_timeout_s: int = setting(3600, "start-up health check timeout", ge=60, le=3600,
                                                  unit="s")
    download_timeout_s: int = setting(3600, "SageMaker model download timeout", ge=60, le=3600, unit="s")
    min_instances: int = setting(1, "endpoint instances at least", ge=1, le=10)
    max_instances: int = setting(1, "endpoint instances at most", ge=1, le=10)
    model_layers: int | None = setting(None, "a model outside the catalogue: layers", ge=1, le=1000)
    model_attention_heads: int | None = setting(None, "... attention heads", ge=1, le=1024)
    model_kv_heads: int | None = setting(None, "... key/value heads", ge=1, le=1024)
    model_head_dim: int | None = setting(None, "... head dimension", ge=1, le=4096)
    model_parameters_billion: float | None = setting(None, "... parameters", ge=0.001, le=10000, unit="billion")
    # Checked against the image's vLLM and DJL's LMI guides in inference/llm/lmi (vllm.py, rules.py).
    vllm_args: tuple[str, ...] = setting((), "other vLLM engine arguments as name=value items")
    enable_prefix_caching: bool | None = setting(None, "vLLM's automatic prefix caching; none: the image's default")
    max_concurrent_requests: int | None = setting(None, "requests one instance holds, batched or queued "
                                                  "(MAX_CONCURRENT_REQUESTS); none: 1000", ge=1, le=100000)
    model_config: ConfigJsonPath | None = setting(None, "the model's config.json: its architecture replaces the "
                                                  "catalogue's")
    hf_token_secret: SecretName | None = setting(None, "Secrets Manager secret holding a Hugging Face token "
                                                 "(gated hub models)")

    @field_validator("model_s3_uri", mode="before")
    @classmethod
    def _weights(cls, value: object) -> object:
        return _s3_location("falcon.model_s3_uri", value, "/", PREFIX_WORDS)

    @field_validator("lmi_version", mode="before")
    @classmethod
    def _renamed_version(cls, value: object) -> object:
        """Up to this release `0.36.0` meant the lmi27 image; AWS has two 0.36.0 images now, so say which it was."""
        if value == "0.36.0":
            raise SettingsError("falcon.lmi_version", value, "0.36.0-lmi27 (the image 0.36.0 deployed before "
                                "0.36 releases were named by LMI number), or one of " + ", ".join(LMI_VERSIONS))
        return value

    @model_validator(mode="after")
    def _instances(self) -> FalconSettings:
        if self.max_instances < self.min_instances:
            raise SettingsError("falcon.max_instances", self.max_instances,
                                f"at least falcon.min_instances ({self.min_instances})")
        return self
