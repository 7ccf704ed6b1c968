"""The Falcon recipe's LMI (DJL Serving) configuration: rendered once, checked before any deploy.

The recipe's lesson is that batching and memory settings decide a 10x difference in throughput, and that wrong
ones fail only at endpoint start, after a long and paid wait. So everything that can be known before deploy is
computed here, in plain Python (no aws_cdk, no SDK, no network), and used by the stack, the tests and the CLI:

    python -m inference.lmi render --env prod > serving.properties
    python -m inference.lmi render --env prod --format env
    python -m inference.lmi sizing --instance-type ml.g5.24xlarge --tensor-parallel-degree 4

`render()` gives one set of serving.properties keys; `to_environment()` and `to_properties_file()` are two
spellings of that one set, so the container's environment and a local serving.properties always agree.
`check()` raises SettingsError for a combination the container or the GPUs cannot run, and returns warnings.

Memory units: everything is in GiB (2**30 bytes), and "GPU memory" is what CUDA can allocate (nvidia-smi's
memory.total), not the marketing figure. An A10G is sold as 24 GB; its 24 GiB of GDDR6 lose 1/16 to ECC, leaving
22.5 GiB. Falcon-40B's 41.84 B fp16 parameters are 77.9 GiB (83.7 GB), so TP 4 puts 19.5 GiB on each GPU, 87% of
what an A10G can hold, and TP 8 on g5.48xlarge puts 9.7 GiB (43%) on each. The recipe's "about 20 GB, 84%" and
"about 10 GB" are the same figures rounded (40 B parameters, 20/24).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from stacks.images import UnsupportedRegionError, dlc_image_uri, dlc_repository_arn
from stacks.settings import FalconSettings, SettingsError, load_settings

GIB = 2**30
LMI_REPOSITORY = "djl-inference"
MODEL_DIR = "/opt/ml/model"

# Image tag of each supported LMI container version (the settings' falcon.lmi_version choices).
LMI_IMAGE_TAGS: dict[str, str] = {
    "0.23.0": "0.23.0-deepspeed0.9.5-cu118",  # the recipe's
    "0.27.0": "0.27.0-deepspeed0.12.6-cu121",  # last DeepSpeed image
    "0.29.0": "0.29.0-lmi11.0.0-cu124",
    "0.33.0": "0.33.0-lmi15.0.0-cu128",  # vLLM 0.8.4
    "0.35.0": "0.35.0-lmi17.0.0-cu128",
    "0.38.0": "0.38.0-lmi29.0.0-cu130",
}

# Share of GPU memory the engine may use (LMI's option.gpu_memory_utilization default, 0.27 and later); the
# sizing applies it to every era so that one budget model covers all of them.
GPU_MEMORY_UTILIZATION = 0.9
# Per GPU, besides weights and KV cache: activations of a prefill step, CUDA graphs, NCCL buffers. An estimate;
# the headroom warning exists because it is one.
RESERVE_GIB = 1.0
# Below this share of KV room left unused, check() warns: a longer prompt mix or a fuller batch may not fit.
MIN_HEADROOM = 0.10


# --- hardware ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gpu:
    name: str
    nominal_gib: int
    usable_gib: float  # what CUDA can allocate (nvidia-smi memory.total)


A10G = Gpu("A10G", 24, 23028 / 1024)  # GDDR6 with ECC: 15/16 of 24 GiB
L4 = Gpu("L4", 24, 23034 / 1024)
L40S = Gpu("L40S", 48, 46068 / 1024)
A100_40 = Gpu("A100 40GB", 40, 40960 / 1024)
A100_80 = Gpu("A100 80GB", 80, 81920 / 1024)
H100 = Gpu("H100", 80, 81559 / 1024)

_ONE_GPU = ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")
# family -> (GPU, {size: GPU count}, local NVMe instance storage)
GPU_INSTANCES: dict[str, tuple[Gpu, dict[str, int], bool]] = {
    "g5": (A10G, {**dict.fromkeys(_ONE_GPU, 1), "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}, True),
    "g6": (L4, {**dict.fromkeys(_ONE_GPU, 1), "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}, True),
    "g6e": (L40S, {**dict.fromkeys(_ONE_GPU, 1), "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}, True),
    "p4d": (A100_40, {"24xlarge": 8}, True),
    "p4de": (A100_80, {"24xlarge": 8}, True),
    "p5": (H100, {"48xlarge": 8}, True),
}


def gpu_instance(instance_type: str) -> tuple[Gpu, int]:
    """The GPU model and count of a SageMaker instance type, or SettingsError naming the ones known."""
    family, _, size = instance_type.removeprefix("ml.").partition(".")
    if family not in GPU_INSTANCES or size not in GPU_INSTANCES[family][1]:
        known = ", ".join(f"ml.{f}.*" for f in GPU_INSTANCES)
        raise SettingsError("falcon.instance_type", instance_type, f"a GPU instance type LMI runs on ({known})")
    gpu, sizes, _ = GPU_INSTANCES[family]
    return gpu, sizes[size]


def has_local_nvme(instance_type: str) -> bool:
    """Instance storage is local NVMe: SageMaker then rejects VolumeSizeInGB and an endpoint-config KmsKeyId."""
    family = instance_type.removeprefix("ml.").partition(".")[0]
    return family in GPU_INSTANCES and GPU_INSTANCES[family][2]


# --- models -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Architecture:
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    parameters_billion: float


_FALCON_40B = Architecture(layers=60, attention_heads=128, kv_heads=8, head_dim=64, parameters_billion=41.84)
_FALCON_7B = Architecture(layers=32, attention_heads=71, kv_heads=1, head_dim=64, parameters_billion=6.92)
CATALOGUE: dict[str, Architecture] = {
    "tiiuae/falcon-40b": _FALCON_40B,
    "tiiuae/falcon-40b-instruct": _FALCON_40B,
    "tiiuae/falcon-7b": _FALCON_7B,
    "tiiuae/falcon-7b-instruct": _FALCON_7B,
}
# Setting name -> Architecture field, for models outside the catalogue (settings also override catalogue values).
_ARCHITECTURE_SETTINGS = {
    "model_layers": "layers",
    "model_attention_heads": "attention_heads",
    "model_kv_heads": "kv_heads",
    "model_head_dim": "head_dim",
    "model_parameters_billion": "parameters_billion",
}
DTYPE_BYTES = {"fp16": 2, "bf16": 2}


def architecture(falcon: FalconSettings) -> Architecture:
    """The catalogue's numbers for model_id, each overridable; a model not in it must give all five."""
    given = {field: getattr(falcon, name) for name, field in _ARCHITECTURE_SETTINGS.items()
             if getattr(falcon, name) is not None}
    base = CATALOGUE.get(falcon.model_id)
    if base is not None:
        return dataclasses.replace(base, **given)
    missing = [f"falcon.{name}" for name, field in _ARCHITECTURE_SETTINGS.items() if field not in given]
    if missing:
        raise SettingsError(missing[0], None, f"the architecture of {falcon.model_id}, which is not in the "
                            f"catalogue ({', '.join(sorted(CATALOGUE))}): set {', '.join(missing)}")
    return Architecture(**given)


def kv_bytes_per_token(arch: Architecture, dtype: str, tensor_parallel_degree: int = 1) -> int:
    """KV cache bytes one token takes on one GPU: 2 (K and V) x layers x KV heads x head_dim x bytes.

    Tensor parallelism splits KV heads across GPUs; with fewer KV heads than GPUs each GPU keeps a copy of one
    head (multi-query Falcon-7B keeps its single head on every GPU), so the per-GPU cost never drops below one.
    """
    heads_per_gpu = arch.kv_heads / tensor_parallel_degree if arch.kv_heads >= tensor_parallel_degree else 1
    return int(2 * arch.layers * heads_per_gpu * arch.head_dim * DTYPE_BYTES[dtype])


# --- container eras ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Era:
    """What one range of LMI releases understands (serving.properties keys and their values)."""

    name: str
    versions: tuple[str, ...]
    rolling_engine: str  # engine for continuous batching
    rolling_backend: str  # option.rolling_batch value for continuous batching
    paged_attention_switch: bool  # option.paged_attention exists (continuous batching without paging)
    rolling_batch_disable: bool  # option.rolling_batch=disable exists (needed where rolling is the default)
    vllm_memory_keys: bool  # option.gpu_memory_utilization and option.max_model_len
    chunked_prefill: bool  # a prefill budget below the model length is served in chunks
    trust_remote_code: bool


ERAS = (
    # lmi-dist 1 (TGI-derived) under MPI; `auto` picks it, as the recipe wrote. The only era where paging is a
    # switch. Transformers of the day had no Falcon, hence remote code.
    Era("0.23 DeepSpeed/lmi-dist", ("0.23.0",), rolling_engine="MPI", rolling_backend="auto",
        paged_attention_switch=True, rolling_batch_disable=False, vllm_memory_keys=False, chunked_prefill=False,
        trust_remote_code=True),
    # lmi-dist 2 is built on vLLM: always paged, still MPI. Falcon is native in transformers, so no hub code runs.
    Era("0.27-0.29 lmi-dist", ("0.27.0", "0.29.0"), rolling_engine="MPI", rolling_backend="lmi-dist",
        paged_attention_switch=False, rolling_batch_disable=True, vllm_memory_keys=True, chunked_prefill=False,
        trust_remote_code=False),
    # vLLM is the only continuous-batching backend from 0.33 (lmi-dist and scheduler removed); Python engine.
    Era("0.33+ vLLM", ("0.33.0", "0.35.0", "0.38.0"), rolling_engine="Python", rolling_backend="vllm",
        paged_attention_switch=False, rolling_batch_disable=True, vllm_memory_keys=True, chunked_prefill=True,
        trust_remote_code=False),
)


def era(lmi_version: str) -> Era:
    for candidate in ERAS:
        if lmi_version in candidate.versions:
            return candidate
    raise SettingsError("falcon.lmi_version", lmi_version, "one of " + ", ".join(LMI_IMAGE_TAGS))


def image_uri(region: str, lmi_version: str) -> str:
    """The LMI image in the region's Deep Learning Containers registry; no SDK call."""
    era(lmi_version)  # an unknown version is a settings error, not a KeyError
    try:
        return dlc_image_uri(region, LMI_REPOSITORY, LMI_IMAGE_TAGS[lmi_version])
    except UnsupportedRegionError as error:
        raise SettingsError("region", region, "a region with a Deep Learning Containers registry") from error


def repository_arn(region: str) -> str:
    try:
        return dlc_repository_arn(region, LMI_REPOSITORY)
    except UnsupportedRegionError as error:
        raise SettingsError("region", region, "a region with a Deep Learning Containers registry") from error


# --- rendering --------------------------------------------------------------------------------------

def render(falcon: FalconSettings) -> dict[str, str]:
    """serving.properties keys for the settings, in the keys and values the chosen container version reads.

    dynamic: Python engine, server-side batch_size/max_batch_delay, rolling batch off.
    rolling: continuous batching with paged attention off (only where paging is a switch).
    rolling_paged: continuous batching with paged attention (lmi-dist, or vLLM from 0.33).
    """
    check_mode_in_version(falcon)
    spec = era(falcon.lmi_version)
    props = {
        "engine": "Python" if falcon.batching == "dynamic" else spec.rolling_engine,
        "option.model_id": MODEL_DIR if falcon.model_s3_uri else falcon.model_id,
        "option.tensor_parallel_degree": str(falcon.tensor_parallel_degree),
        "option.dtype": falcon.dtype,
        "option.trust_remote_code": _flag(spec.trust_remote_code),
        "option.model_loading_timeout": str(falcon.model_loading_timeout_s),
    }
    if falcon.batching == "dynamic":
        if spec.rolling_batch_disable:
            props["option.rolling_batch"] = "disable"
        props["batch_size"] = str(falcon.batch_size)
        props["max_batch_delay"] = str(falcon.max_batch_delay_ms)
        return props
    max_model_len = falcon.max_input_tokens + falcon.max_new_tokens
    props["option.rolling_batch"] = spec.rolling_backend
    props["option.max_rolling_batch_size"] = str(falcon.max_rolling_batch_size)
    props["option.max_rolling_batch_prefill_tokens"] = str(falcon.max_rolling_batch_prefill_tokens)
    if spec.paged_attention_switch:
        props["option.paged_attention"] = _flag(falcon.batching == "rolling_paged")
    if spec.vllm_memory_keys:
        props["option.max_model_len"] = str(max_model_len)
        props["option.gpu_memory_utilization"] = str(GPU_MEMORY_UTILIZATION)
    if spec.chunked_prefill and falcon.max_rolling_batch_prefill_tokens < max_model_len:
        props["option.enable_chunked_prefill"] = "true"
    return props


def _flag(value: bool) -> str:
    return "true" if value else "false"


def environment_name(key: str) -> str:
    """The environment variable DJL Serving reads for a serving.properties key."""
    if key == "engine":
        return "OPTION_ENGINE"
    if key.startswith("option."):
        return "OPTION_" + key.removeprefix("option.").upper()
    return "SERVING_" + key.upper()


def to_environment(props: Mapping[str, str]) -> dict[str, str]:
    return {environment_name(key): value for key, value in props.items()}


def to_properties_file(props: Mapping[str, str]) -> str:
    lines = ["# Rendered by `python -m inference.lmi render`; the endpoint gets the same keys as environment."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


# --- rules: each raises SettingsError with what to change ---------------------------------------------

TIMEOUT_RANGE = (60, 3600)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(FalconSettings)}
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
    spec = era(falcon.lmi_version)
    if falcon.batching == "rolling" and not spec.paged_attention_switch:
        offering = [v for e in ERAS if e.paged_attention_switch for v in e.versions]
        raise SettingsError(
            "falcon.batching", falcon.batching,
            f"dynamic or rolling_paged with lmi_version {falcon.lmi_version}: continuous batching without paged "
            f"attention exists only in LMI 0.23-0.25 (lmi_version {', '.join(offering)}); later releases always "
            "page the KV cache")


def check_prefill_holds_a_prompt(falcon: FalconSettings) -> None:
    """Without chunked prefill a prompt is prefilled in one step, so the prefill budget must hold a whole one."""
    if falcon.batching == "dynamic" or era(falcon.lmi_version).chunked_prefill:
        return
    if falcon.max_rolling_batch_prefill_tokens < falcon.max_input_tokens:
        raise SettingsError(
            "falcon.max_rolling_batch_prefill_tokens", falcon.max_rolling_batch_prefill_tokens,
            f"at least falcon.max_input_tokens ({falcon.max_input_tokens}): LMI {falcon.lmi_version} has no chunked "
            "prefill, so a longer prompt cannot be scheduled")


def check_tensor_parallel(falcon: FalconSettings) -> None:
    _, gpus = gpu_instance(falcon.instance_type)
    tp = falcon.tensor_parallel_degree
    if tp > gpus:
        raise SettingsError("falcon.tensor_parallel_degree", tp,
                            f"at most {gpus}, the GPU count of one {falcon.instance_type}")
    arch = architecture(falcon)
    divisors = [d for d in (1, 2, 4, 8) if d <= gpus and arch.attention_heads % d == 0]
    if arch.attention_heads % tp:
        raise SettingsError("falcon.tensor_parallel_degree", tp,
                            f"a divisor of the {arch.attention_heads} attention heads of {falcon.model_id} "
                            f"({', '.join(map(str, divisors))} here)")
    if arch.kv_heads % tp and tp % arch.kv_heads:
        raise SettingsError("falcon.tensor_parallel_degree", tp,
                            f"a divisor or multiple of the {arch.kv_heads} KV heads of {falcon.model_id}")


# --- sizing -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SizingReport:
    """GPU memory per GPU for one configuration, in the recipe's terms (GiB, see the module docstring)."""

    model_id: str
    dtype: str
    instance_type: str
    gpu: Gpu
    gpus: int
    tensor_parallel_degree: int
    weights_gib: float
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    request_tokens: int
    batch_setting: str
    configured_batch: int

    @property
    def weights_per_gpu_gib(self) -> float:
        return self.weights_gib / self.tensor_parallel_degree

    @property
    def weights_share(self) -> float:
        """Weights per GPU as a share of the memory CUDA can use on that GPU."""
        return self.weights_per_gpu_gib / self.gpu.usable_gib

    @property
    def budget_gib(self) -> float:
        return self.gpu.usable_gib * GPU_MEMORY_UTILIZATION

    @property
    def weights_fit(self) -> bool:
        return self.weights_per_gpu_gib <= self.budget_gib

    @property
    def kv_room_gib(self) -> float:
        return max(0.0, self.budget_gib - self.weights_per_gpu_gib - RESERVE_GIB)

    @property
    def tokens_fit(self) -> int:
        return int(self.kv_room_gib * GIB // self.kv_bytes_per_token_per_gpu)

    @property
    def largest_batch(self) -> int:
        return self.tokens_fit // self.request_tokens

    @property
    def kv_use(self) -> float:
        """Share of the KV room the configured batch of full-length requests takes (inf when there is none)."""
        needed = self.configured_batch * self.request_tokens
        return needed / self.tokens_fit if self.tokens_fit else math.inf

    def format_report(self) -> str:
        gpu = self.gpu
        batch = (f"largest batch {self.largest_batch:,}; {self.batch_setting}={self.configured_batch} "
                 f"uses {self.kv_use:.0%} of the KV room" if self.tokens_fit else "no KV room left")
        return "\n".join([
            f"{self.model_id} {self.dtype} on {self.instance_type} ({self.gpus}x {gpu.name}, "
            f"{gpu.usable_gib:.1f} GiB usable of {gpu.nominal_gib}), tensor parallel {self.tensor_parallel_degree}",
            f"  weights   {self.weights_gib:.1f} GiB, {self.weights_per_gpu_gib:.1f} GiB per GPU "
            f"= {self.weights_share:.0%} of GPU memory",
            f"  KV cache  {self.kv_bytes_per_token:,} bytes per token ({self.kv_bytes_per_token_per_gpu:,} per GPU)",
            f"  KV room   {self.kv_room_gib:.1f} GiB per GPU ({GPU_MEMORY_UTILIZATION} x {gpu.usable_gib:.1f} GiB "
            f"- weights - {RESERVE_GIB:.1f} GiB reserve) = {self.tokens_fit:,} tokens",
            f"  requests  {self.request_tokens:,} tokens (input + new): {batch}",
        ])


def sizing(falcon: FalconSettings) -> SizingReport:
    """The numbers, whether or not they fit (check() turns a misfit into an error)."""
    gpu, gpus = gpu_instance(falcon.instance_type)
    arch = architecture(falcon)
    dynamic = falcon.batching == "dynamic"
    return SizingReport(
        model_id=falcon.model_id, dtype=falcon.dtype, instance_type=falcon.instance_type, gpu=gpu, gpus=gpus,
        tensor_parallel_degree=falcon.tensor_parallel_degree,
        weights_gib=arch.parameters_billion * 1e9 * DTYPE_BYTES[falcon.dtype] / GIB,
        kv_bytes_per_token=kv_bytes_per_token(arch, falcon.dtype),
        kv_bytes_per_token_per_gpu=kv_bytes_per_token(arch, falcon.dtype, falcon.tensor_parallel_degree),
        request_tokens=falcon.max_input_tokens + falcon.max_new_tokens,
        batch_setting="batch_size" if dynamic else "max_rolling_batch_size",
        configured_batch=falcon.batch_size if dynamic else falcon.max_rolling_batch_size,
    )


def check_memory(falcon: FalconSettings) -> list[str]:
    """Weights must fit, the configured batch's KV cache must fit; little headroom is a warning."""
    report = sizing(falcon)
    where = f"{falcon.model_id} {falcon.dtype} with tensor parallel {falcon.tensor_parallel_degree}"
    if not report.weights_fit:
        raise SettingsError(
            "falcon.instance_type", falcon.instance_type,
            f"GPUs that hold the weights: {where} puts {report.weights_per_gpu_gib:.1f} GiB on each GPU, over the "
            f"{report.budget_gib:.1f} GiB budget of an {report.gpu.name}; use {_bigger(falcon)}")
    if report.largest_batch == 0:
        raise SettingsError(
            "falcon.instance_type", falcon.instance_type,
            f"room for the KV cache: {where} puts {report.weights_per_gpu_gib:.1f} GiB on each GPU, which with "
            f"the {RESERVE_GIB:.1f} GiB reserve leaves {report.tokens_fit:,} tokens of the {report.budget_gib:.1f} "
            f"GiB budget of an {report.gpu.name}, less than one request of {report.request_tokens:,}; "
            f"use {_bigger(falcon)}")
    if report.largest_batch < report.configured_batch:
        raise SettingsError(
            f"falcon.{report.batch_setting}", report.configured_batch,
            f"at most {report.largest_batch}: the KV room on {falcon.instance_type} with tensor parallel "
            f"{falcon.tensor_parallel_degree} holds {report.tokens_fit:,} tokens, {report.largest_batch} requests "
            f"of {falcon.max_input_tokens} + {falcon.max_new_tokens} tokens")
    if report.kv_use > 1 - MIN_HEADROOM:
        return [f"little headroom: {report.batch_setting}={report.configured_batch} requests of "
                f"{report.request_tokens} tokens use {report.kv_use:.0%} of the KV room on {falcon.instance_type} "
                f"(largest batch {report.largest_batch})"]
    return []


def _bigger(falcon: FalconSettings) -> str:
    """The smallest step up in the same instance family that holds the configured batch, as advice."""
    family = falcon.instance_type.removeprefix("ml.").partition(".")[0]
    sizes = GPU_INSTANCES[family][1]
    heads = architecture(falcon).attention_heads
    for tp in (2, 4, 8):
        size = next((s for s, count in sizes.items() if count >= tp), None)
        if tp <= falcon.tensor_parallel_degree or size is None or heads % tp:
            continue
        candidate = dataclasses.replace(falcon, instance_type=f"ml.{family}.{size}", tensor_parallel_degree=tp)
        report = sizing(candidate)
        if report.largest_batch >= report.configured_batch:
            return f"tensor parallel {tp} on {candidate.instance_type}"
    return "GPUs with more memory"


def check(falcon: FalconSettings) -> list[str]:
    """Every rule, cheapest first; raises SettingsError on the first failure, returns warnings."""
    check_timeouts(falcon)
    check_health_check_covers_loading(falcon)
    check_batching_keys(falcon)
    check_mode_in_version(falcon)
    check_prefill_holds_a_prompt(falcon)
    check_tensor_parallel(falcon)
    return check_memory(falcon)


# --- command line -----------------------------------------------------------------------------------

_SETTING_FLAGS = [f.name for f in dataclasses.fields(FalconSettings) if f.name != "enabled"]


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--env", help="environment from cdk.json whose falcon settings to start from (default dev)")
    overrides = common.add_argument_group("settings", "override one falcon.* setting, validated as in cdk synth")
    for name in _SETTING_FLAGS:
        overrides.add_argument("--" + name.replace("_", "-"), dest=name, metavar="VALUE")
    parser = argparse.ArgumentParser(prog="python -m inference.lmi", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    render_command = commands.add_parser("render", parents=[common], help="print the LMI configuration")
    render_command.add_argument("--format", choices=("properties", "env"), default="properties",
                                help="serving.properties (default) or the environment variables the endpoint gets")
    commands.add_parser("sizing", parents=[common], help="print GPU memory per GPU and the largest batch")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit status 0: fine; 1: the settings cannot run (one `error:` line on stderr); 2: usage."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    overrides = {f"falcon.{name}": getattr(args, name) for name in _SETTING_FLAGS if getattr(args, name) is not None}
    try:
        falcon = load_settings(args.env, overrides).falcon
        if args.command == "sizing":
            print(sizing(falcon).format_report())
        warnings = check(falcon)
        if args.command == "render":
            props = render(falcon)
            if args.format == "env":
                print("\n".join(f"{name}={value}" for name, value in to_environment(props).items()))
            else:
                print(to_properties_file(props), end="")
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
