"""One typed, frozen settings object per environment, validated once at app start.

Defaults live on the dataclasses below; `cdk.json` (context key `environments`) declares each
environment as overrides of those defaults; `-c section.key=value` overrides any of them from the
command line. Every error names the setting, the value given and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
CDK_JSON = REPO_ROOT / "cdk.json"
DEFAULT_ENVIRONMENT = "dev"

# CloudWatch Logs accepts only these retention periods.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                      2557, 2922, 3288, 3653)

# Context keys that belong to the CDK itself or to the environment selector, not to our settings.
_RESERVED_CONTEXT_KEYS = {"env", "environments", "shared"}


class SettingsError(ValueError):
    """A setting is wrong; the message is one line a user can act on."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid setting {key}={_show(value)}: expected {allowed}")


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    return json.dumps(value) if isinstance(value, (bool, int, float, list, dict, type(None))) else repr(value)


def setting(default: Any = None, *, minimum: float | None = None, maximum: float | None = None,
            choices: tuple | None = None, pattern: str | None = None, describe: str | None = None,
            default_factory: Any = None) -> Any:
    """A dataclass field carrying its own constraints, so validation is declared next to the default."""
    metadata = {"minimum": minimum, "maximum": maximum, "choices": choices, "pattern": pattern,
                "describe": describe}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


INSTANCE_TYPE_EC2 = r"^[a-z][a-z0-9-]*\.[0-9]*[a-z0-9]+$"
INSTANCE_TYPE_SAGEMAKER = r"^ml\.[a-z][a-z0-9-]*\.[0-9]*[a-z0-9]+$"
REGION = r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$"


# --- sections ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EndpointSettings:
    """VPC endpoints, each switchable: interface endpoints cost money per AZ and hour."""

    s3_gateway: bool = True
    sagemaker_api: bool = True
    sagemaker_runtime: bool = True
    ecr_api: bool = True
    ecr_docker: bool = True
    cloudwatch_logs: bool = True
    ssm: bool = True
    ssm_messages: bool = True
    ec2_messages: bool = True
    sts: bool = True


@dataclass(frozen=True)
class NetworkSettings:
    cidr: str = setting("10.40.0.0/16", pattern=r"^\d{1,3}(\.\d{1,3}){3}/(1[6-9]|2[0-4])$",
                        describe="an IPv4 CIDR block from /16 to /24")
    # Zone names are needed only when an account is set (offline synth cannot look them up).
    availability_zones: tuple[str, ...] = setting((), describe="two zone names such as us-west-2a,us-west-2b")
    nat_gateways: int = setting(1, minimum=1, maximum=2)
    flow_log_retention_days: int = setting(90, choices=LOG_RETENTION_DAYS)
    endpoints: EndpointSettings = field(default_factory=EndpointSettings)

    def __post_init__(self) -> None:
        zones = self.availability_zones
        if zones and (len(zones) != 2 or len(set(zones)) != 2):
            raise SettingsError("network.availability_zones", ",".join(zones), "exactly two distinct zone names")


@dataclass(frozen=True)
class ArtifactSettings:
    noncurrent_version_expiration_days: int = setting(90, minimum=1, maximum=3650)
    access_log_expiration_days: int = setting(365, minimum=1, maximum=3650)


@dataclass(frozen=True)
class TrainingSettings:
    # Deploying with enabled=true starts a paid GPU run, so it is always an explicit choice.
    enabled: bool = False
    instance_type: str = setting("p4d.24xlarge", pattern=INSTANCE_TYPE_EC2,
                                 describe="an EC2 instance type such as p4d.24xlarge")
    run_id: str = setting("run-0001", pattern=r"^[a-z0-9][a-z0-9-]{0,47}$",
                          describe="lowercase letters, digits and '-', at most 48 characters")
    volume_gib: int = setting(200, minimum=50, maximum=16384)
    max_hours: int = setting(6, minimum=1, maximum=72)
    log_retention_days: int = setting(30, choices=LOG_RETENTION_DAYS)
    ami_parameter: str = setting(
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
        pattern=r"^/aws/service/.+", describe="a public SSM parameter name under /aws/service/")
    base_image_tag: str = setting("2.10.0-gpu-py313-cu130-ubuntu22.04-ec2", pattern=r"^[A-Za-z0-9._-]+$")
    base_model: str = "cardiffnlp/twitter-roberta-base-sep2022"
    epochs: int = setting(10, minimum=1, maximum=100)
    learning_rate: float = setting(1e-5, minimum=1e-7, maximum=1e-2)
    per_device_batch_size: int = setting(16, minimum=1, maximum=1024)
    max_length: int = setting(128, minimum=8, maximum=512)
    # A slice of the data for cheap runs (the smoke environment); None trains on everything.
    max_train_samples: int | None = setting(None, minimum=1, maximum=10_000_000)
    max_eval_samples: int | None = setting(None, minimum=1, maximum=10_000_000)
    # Where P-instance capacity is (one of network.availability_zones); None takes the first private subnet.
    availability_zone: str | None = setting(None, pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$",
                                            describe="a zone name such as us-west-2a")
    # An EC2 capacity reservation (On-Demand Capacity Reservation or Capacity Block) to launch into.
    capacity_reservation_id: str | None = setting(None, pattern=r"^cr-[0-9a-f]{8,17}$",
                                                  describe="a capacity reservation id such as cr-0123456789abcdef0")
    # Where the run happens: `ec2` is the recipe's one self-terminating instance (training.enabled starts it);
    # `sagemaker` synthesizes a SageMaker Pipeline per environment (it costs nothing until `make train`).
    backend: str = setting("ec2", choices=("ec2", "sagemaker"))
    # SageMaker backend: ml.<instance_type> x instance_count, torchrun across every GPU of every instance.
    instance_count: int = setting(1, minimum=1, maximum=64)
    spot: bool = False
    # Managed spot: how long SageMaker may wait for capacity, counted with the runtime (at least max_hours).
    spot_max_wait_hours: int | None = setting(None, minimum=1, maximum=72)
    # The pipeline registers the model only when validation macro recall reaches this.
    min_macro_recall: float = setting(0.6, minimum=0.0, maximum=1.0)
    sagemaker_image_tag: str = setting("2.10.0-gpu-py313-cu130-ubuntu22.04-sagemaker", pattern=r"^[A-Za-z0-9._-]+$",
                                       describe="a pytorch-training image tag ending in -sagemaker")

    def __post_init__(self) -> None:
        if self.backend == "ec2" and self.instance_count != 1:
            raise SettingsError("training.instance_count", self.instance_count,
                                "1 with training.backend=ec2 (multi-node needs training.backend=sagemaker)")
        if self.backend == "ec2" and self.spot:
            raise SettingsError("training.spot", self.spot, "false with training.backend=ec2 (managed spot "
                                "needs training.backend=sagemaker)")
        if self.spot_max_wait_hours is not None and self.spot_max_wait_hours < self.max_hours:
            raise SettingsError("training.spot_max_wait_hours", self.spot_max_wait_hours,
                                f"at least training.max_hours ({self.max_hours}), or unset")
        if self.backend == "sagemaker" and not self.sagemaker_image_tag.endswith("-sagemaker"):
            raise SettingsError("training.sagemaker_image_tag", self.sagemaker_image_tag,
                                "a pytorch-training tag ending in -sagemaker (the -ec2 images are for EC2)")

    @property
    def sagemaker_instance_type(self) -> str:
        return f"ml.{self.instance_type}"

    @property
    def spot_wait_hours(self) -> int:
        """MaxWaitTimeInSeconds in hours: the setting, or twice the runtime limit (72 h at most)."""
        return self.spot_max_wait_hours or min(2 * self.max_hours, 72)


@dataclass(frozen=True)
class SentimentSettings:
    """The Graviton endpoint for the fine-tuned model (images and instance sizes in stacks/sentiment.py)."""

    enabled: bool = False
    model_data_url: str | None = setting(None, pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+\.tar\.gz$",
                                         describe="an s3:// URI of a model.tar.gz")
    instance_type: str = setting("ml.c7g.4xlarge", pattern=INSTANCE_TYPE_SAGEMAKER,
                                 describe="a SageMaker instance type such as ml.c7g.4xlarge")
    pytorch_version: str = setting("2.6.0", choices=("2.4.0", "2.6.0"))
    min_instances: int = setting(1, minimum=1, maximum=20)
    max_instances: int = setting(2, minimum=1, maximum=20)
    # Model server workers per instance; they share the vCPUs TorchServe's front end leaves
    # (inference/sentiment/container.py).
    workers: int = setting(2, minimum=1, maximum=64)
    max_batch: int = setting(64, minimum=1, maximum=1024)
    invocations_per_instance: int = setting(600, minimum=1, maximum=100000)
    latency_alarm_ms: int = setting(1000, minimum=1, maximum=60000)
    canary_percent: int = setting(10, minimum=1, maximum=50)
    bake_minutes: int = setting(10, minimum=1, maximum=60)
    # Target tracking between min_instances and max_instances (when max > min). Application Auto Scaling refuses
    # an endpoint update that changes an autoscaled variant's instance type: to change instance_type, deploy
    # with autoscaling=false, then the new type, then autoscaling=true again (README, "Updating").
    autoscaling: bool = True
    # Dynamic int8 quantization of the Linear layers at load (SENTIMENT_QUANTIZE): about 3x requests/s on CPU,
    # slightly different scores; run `python -m inference.sentiment.accuracy_check` on the model before turning it on.
    quantize: str = setting("none", choices=("none", "int8"))

    def __post_init__(self) -> None:
        if self.enabled and not self.model_data_url:
            raise SettingsError("sentiment.model_data_url", self.model_data_url,
                                "an s3://.../model.tar.gz URI when sentiment.enabled is true")
        if self.max_instances < self.min_instances:
            raise SettingsError("sentiment.max_instances", self.max_instances,
                                f"at least sentiment.min_instances ({self.min_instances})")


# LMI releases offered (inference/llm/lmi/versions.py says what each one does and what was checked). 0.36.0 names
# two images (lmi27, lmi28), so the 0.36 and later releases carry their LMI number.
LMI_VERSIONS = ("0.23.0", "0.33.0", "0.35.0", "0.36.0-lmi27", "0.36.0-lmi28", "0.38.0-lmi29")


@dataclass(frozen=True)
class FalconSettings:
    """The Falcon recipe's LMI deployment; cross-checks against GPUs and container live in inference.llm.lmi."""

    enabled: bool = False
    model_id: str = setting("tiiuae/falcon-40b", pattern=r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$",
                            describe="a Hugging Face model id such as tiiuae/falcon-40b")
    # Uncompressed weights under an S3 prefix, served from /opt/ml/model instead of the hub.
    model_s3_uri: str | None = setting(None, pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+/$",
                                       describe="an s3:// prefix ending in /")
    # Hub revision (commit hash, tag or branch) the container downloads; None follows the hub's main branch.
    model_revision: str | None = setting(None, pattern=r"^[A-Za-z0-9][\w.-]{0,99}$",
                                         describe="a Hugging Face revision: a commit hash, tag or branch name")
    instance_type: str = setting("ml.g5.48xlarge", pattern=INSTANCE_TYPE_SAGEMAKER,
                                 describe="a SageMaker instance type such as ml.g5.48xlarge")
    tensor_parallel_degree: int = setting(8, choices=(1, 2, 4, 8))
    dtype: str = setting("fp16", choices=("fp16", "bf16"))
    lmi_version: str = setting("0.36.0-lmi27", choices=LMI_VERSIONS)
    batching: str = setting("rolling_paged", choices=("dynamic", "rolling", "rolling_paged"))
    batch_size: int = setting(4, minimum=1, maximum=64)
    max_batch_delay_ms: int = setting(100, minimum=1, maximum=10000)
    max_rolling_batch_size: int = setting(32, minimum=1, maximum=1024)
    max_rolling_batch_prefill_tokens: int = setting(1024, minimum=16, maximum=1048576)
    max_input_tokens: int = setting(1024, minimum=1, maximum=131072)
    max_new_tokens: int = setting(256, minimum=1, maximum=131072)
    # vLLM's share of each GPU for weights, activations and KV cache (LMI 0.33+ continuous batching only).
    gpu_memory_utilization: float = setting(0.9, minimum=0.5, maximum=0.98)
    # LMI 0.23 rolling batch: `json` streams one JSON document in pieces; `jsonlines` one JSON line per token.
    output_formatter: str = setting("json", choices=("json", "jsonlines"))
    model_loading_timeout_s: int = setting(1800, minimum=60, maximum=3600)
    startup_health_check_timeout_s: int = setting(3600, minimum=60, maximum=3600)
    download_timeout_s: int = setting(3600, minimum=60, maximum=3600)
    min_instances: int = setting(1, minimum=1, maximum=10)
    max_instances: int = setting(1, minimum=1, maximum=10)
    # Architecture of a model outside the built-in catalogue (inference.llm.lmi), for the GPU memory check.
    model_layers: int | None = setting(None, minimum=1, maximum=1000)
    model_attention_heads: int | None = setting(None, minimum=1, maximum=1024)
    model_kv_heads: int | None = setting(None, minimum=1, maximum=1024)
    model_head_dim: int | None = setting(None, minimum=1, maximum=4096)
    model_parameters_billion: float | None = setting(None, minimum=0.001, maximum=10000)
    # --- issue 22: vLLM arguments, prefix caching, concurrency, gated models (checked in inference.llm.lmi) ---
    # Any other vLLM engine argument, as name=value items; each name must be an EngineArgs field of the vLLM the
    # image bundles, and its value of that field's type (inference/llm/lmi/vllm.py).
    vllm_args: tuple[str, ...] = setting((), describe="name=value items (vLLM engine arguments), comma-separated")
    # vLLM's automatic prefix caching (option.enable_prefix_caching); None keeps the image's vLLM default.
    enable_prefix_caching: bool | None = None
    # LMI's MAX_CONCURRENT_REQUESTS (job_queue_size): requests one instance holds, batched or queued; None: 1000.
    max_concurrent_requests: int | None = setting(None, minimum=1, maximum=100000)
    # Path to the model's Hugging Face config.json: its architecture replaces the catalogue's (any decoder).
    model_config: str | None = setting(None, pattern=r"^\S+\.json$", describe="a path to a config.json file")
    # A Secrets Manager secret (name or ARN) whose SecretString is a Hugging Face token, for gated hub models.
    hf_token_secret: str | None = setting(
        None, pattern=r"^(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:)?[A-Za-z0-9/_+=.@-]{1,512}$",
        describe="a Secrets Manager secret name or ARN")

    def __post_init__(self) -> None:
        if self.max_instances < self.min_instances:
            raise SettingsError("falcon.max_instances", self.max_instances,
                                f"at least falcon.min_instances ({self.min_instances})")


@dataclass(frozen=True)
class OperationsSettings:
    """Glue and visibility: model registration, the training watchdog, alarms and the dashboard."""

    # Subscribed to the environment's alarm topic when set (the subscription must be confirmed by mail).
    alarm_email: str | None = setting(None, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", describe="an e-mail address")
    watchdog_minutes: int = setting(15, minimum=5, maximum=1440)
    log_retention_days: int = setting(90, choices=LOG_RETENTION_DAYS)
    # Powertools for AWS Lambda: the layer is built from this installed, pinned package (stacks/powertools.py).
    powertools_version: str = setting("3.37.0", pattern=r"^\d+\.\d+\.\d+$", describe="a version such as 3.37.0")
    # Retention of the endpoints' container log groups (/aws/sagemaker/Endpoints/<name>), created by the stacks.
    endpoint_log_retention_days: int = setting(90, choices=LOG_RETENTION_DAYS)


@dataclass(frozen=True)
class PipelineSettings:
    """The CDK pipeline that deploys dev, staging and prod; usually set once in cdk.json `shared`."""

    enabled: bool = False
    connection_arn: str = setting(
        "arn:aws:codeconnections:us-west-2:111111111111:connection/00000000-0000-0000-0000-000000000000",
        pattern=r"^arn:aws[a-z-]*:code(star-)?connections:[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}$",
        describe="a CodeConnections connection ARN")
    repository: str = setting("my-org/ml-recipes", pattern=r"^[\w.-]+/[\w.-]+$", describe="owner/name")
    branch: str = setting("main", pattern=r"^[\w./-]+$", describe="a branch name")
    account: str | None = setting(None, pattern=r"^\d{12}$", describe="a 12-digit AWS account id")
    region: str | None = setting(None, pattern=REGION, describe="an AWS region name such as us-west-2")
    stages: tuple[str, ...] = setting(("dev", "staging", "prod"), describe="environment names in deploy order")
    # A manual approval is always placed before the prod stage.
    approval_before: str = setting("prod", pattern=r"^[a-z][a-z0-9-]*$", describe="an environment name")


@dataclass(frozen=True)
class Settings:
    """Everything one environment deploys; built only through `load_settings`."""

    name: str
    project: str = setting("mlrecipes", pattern=r"^[a-z][a-z0-9-]{1,20}$",
                           describe="lowercase letters, digits and '-', 2 to 21 characters")
    region: str = setting("us-west-2", pattern=REGION, describe="an AWS region name such as us-west-2")
    account: str | None = setting(None, pattern=r"^\d{12}$", describe="a 12-digit AWS account id")
    network: NetworkSettings = field(default_factory=NetworkSettings)
    artifacts: ArtifactSettings = field(default_factory=ArtifactSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    sentiment: SentimentSettings = field(default_factory=SentimentSettings)
    falcon: FalconSettings = field(default_factory=FalconSettings)
    operations: OperationsSettings = field(default_factory=OperationsSettings)
    pipeline: PipelineSettings = field(default_factory=PipelineSettings)

    @property
    def stack_prefix(self) -> str:
        return f"{self.project}-{self.name}"

    @property
    def tags(self) -> dict[str, str]:
        return {"project": self.project, "environment": self.name}


# --- loading ----------------------------------------------------------------------------------------

def read_environments(path: Path = CDK_JSON) -> dict[str, dict[str, Any]]:
    """The environment declarations from cdk.json, the one place they live."""
    environments = json.loads(path.read_text())["context"]["environments"]
    return {name: dict(values or {}) for name, values in environments.items()}


def read_shared(path: Path = CDK_JSON) -> dict[str, Any]:
    """Settings every environment shares (cdk.json context `shared`), such as the pipeline's source."""
    return dict(json.loads(path.read_text())["context"].get("shared") or {})


def load_settings(env_name: str | None = None, overrides: Mapping[str, Any] | None = None,
                  environments: Mapping[str, Mapping[str, Any]] | None = None,
                  shared: Mapping[str, Any] | None = None) -> Settings:
    """Defaults, then shared values, then the environment's declaration, then overrides; validated as one."""
    if environments is None:
        environments, shared = read_environments(), read_shared() if shared is None else shared
    env_name = env_name or DEFAULT_ENVIRONMENT
    if env_name not in environments:
        raise SettingsError("env", env_name, "one of " + ", ".join(environments))
    values: dict[str, Any] = {}
    for source in (shared or {}, environments[env_name], *_split_overrides(overrides or {}, env_name, environments)):
        for key, value in _flatten(source).items():
            _check_known(key, value)
            values[key] = value
    return _build(Settings, {"name": env_name, **values}, prefix="")


def settings_from_context(context: Mapping[str, Any]) -> Settings:
    """Settings from CDK context: `env` selects, every dotted or top-level key of ours overrides."""
    env_name = context.get("env")
    if env_name is not None and not isinstance(env_name, str):
        raise SettingsError("env", env_name, "an environment name")
    return load_settings(env_name, overrides_from_context(context))


def overrides_from_context(context: Mapping[str, Any]) -> dict[str, Any]:
    """Our keys among the CDK context: `section.key` for every environment, `<env>/section.key` for one."""
    return {key: value for key, value in context.items() if _is_ours(key)}


def _split_overrides(overrides: Mapping[str, Any], env_name: str,
                     environments: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(overrides for every environment, overrides scoped to `env_name` with `<env>/`); scoped ones win."""
    common, scoped = {}, {}
    for key, value in overrides.items():
        if "/" not in key:
            common[key] = value
            continue
        prefix, setting_key = key.split("/", 1)
        if prefix not in environments:
            raise SettingsError(key, value, "an environment prefix among " + ", ".join(environments))
        if prefix == env_name:
            scoped[setting_key] = value
    return common, scoped


def known_settings() -> list[str]:
    """Every dotted setting path, for help texts and error messages."""
    return sorted(_paths(Settings, ""))


def _is_ours(key: str) -> bool:
    # The CDK's own context keys carry '@' or ':' (feature flags, lookups, aws:cdk:*).
    return key not in _RESERVED_CONTEXT_KEYS and not key.startswith("@") and ":" not in key


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def _paths(cls: type, prefix: str) -> list[str]:
    paths = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == "name" and cls is Settings:
            continue
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            paths.extend(_paths(kind, f"{prefix}{f.name}."))
        else:
            paths.append(prefix + f.name)
    return paths


def _check_known(key: str, value: Any) -> None:
    known = known_settings()
    if key in known:
        return
    section = key.rsplit(".", 1)[0] + "." if "." in key else ""
    siblings = [k.removeprefix(section) for k in known if section and k.startswith(section)]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    if siblings:
        allowed = f"a known setting{hint}; {section.rstrip('.')} has: {', '.join(siblings)}"
    else:
        sections = sorted({k.split('.')[0] for k in known})
        allowed = f"a known setting{hint}; sections and top-level settings: {', '.join(sections)}"
    raise SettingsError(key, value, allowed)


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    kwargs: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        path = prefix + f.name
        if dataclasses.is_dataclass(kind):
            kwargs[f.name] = _build(kind, values, path + ".")
        elif path in values:
            kwargs[f.name] = _coerce(path, values[path], kind, f.metadata)
    return cls(**kwargs)


def _coerce(key: str, raw: Any, kind: Any, meta: Mapping[str, Any]) -> Any:
    """Parse a value (JSON-typed from cdk.json, or a string from `-c`) to the setting's type and check it."""
    optional = False
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        optional, kind = True, args[0]
    if optional and (raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none", "null"))):
        return None
    value = _parse(key, raw, kind, meta)
    _check_constraints(key, raw, value, meta)
    return value


def _type_word(kind: Any, meta: Mapping[str, Any]) -> str:
    if meta.get("describe"):
        return meta["describe"]
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    word = words.get(kind, "a comma-separated list")
    if meta.get("choices"):
        return "one of " + ", ".join(str(c) for c in meta["choices"])
    lo, hi = meta.get("minimum"), meta.get("maximum")
    if lo is not None and hi is not None:
        return f"{word} from {lo:g} to {hi:g}"
    return word


def _parse(key: str, raw: Any, kind: Any, meta: Mapping[str, Any]) -> Any:
    fail = SettingsError(key, raw, _type_word(kind, meta))
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false", "yes", "no", "1", "0", "on", "off"):
            return raw.strip().lower() in ("true", "yes", "1", "on")
        raise fail
    if kind is int:
        if isinstance(raw, bool):
            raise fail
        if isinstance(raw, int):
            return raw
        if isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d+\s*", raw):
            return int(raw)
        raise fail
    if kind is float:
        if isinstance(raw, bool):
            raise fail
        if isinstance(raw, (int, float)):
            return float(raw)
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise fail from None
    if kind is str:
        if isinstance(raw, str):
            return raw.strip()
        raise fail
    if typing.get_origin(kind) is tuple:
        if isinstance(raw, str):
            items = [item.strip() for item in raw.split(",") if item.strip()]
        elif isinstance(raw, (list, tuple)) and all(isinstance(item, str) for item in raw):
            items = list(raw)
        else:
            raise fail
        return tuple(items)
    raise TypeError(f"setting {key} has an unsupported type {kind!r}")


def _check_constraints(key: str, raw: Any, value: Any, meta: Mapping[str, Any]) -> None:
    choices, lo, hi, pattern = meta.get("choices"), meta.get("minimum"), meta.get("maximum"), meta.get("pattern")
    if choices is not None and value not in choices:
        raise SettingsError(key, raw, "one of " + ", ".join(str(c) for c in choices))
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise SettingsError(key, raw, f"a value from {lo:g} to {hi:g}")
    if pattern is not None and isinstance(value, str) and not re.fullmatch(pattern, value):
        raise SettingsError(key, raw, meta.get("describe") or f"a value matching {pattern}")
