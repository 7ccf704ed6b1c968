"""GPU memory per GPU, by the rule of the engine that will run (see versions.py for which one that is).

Units: GiB (2**30 bytes); "GPU memory" is what CUDA can allocate (nvidia-smi's memory.total). An A10G is sold as
24 GB; its 24 GiB of GDDR6 lose 1/16 to ECC, leaving 22.5 GiB. Falcon-40B's 41.84 B fp16 parameters are 77.9 GiB
(83.7 GB), so TP 4 puts 19.5 GiB on each GPU, 87% of what an A10G can hold, and TP 8 on g5.48xlarge puts 9.7 GiB
(43%) on each. The recipe's "about 20 GB, 84%" and "about 10 GB" are the same figures rounded (40 B, 20/24).

Engines:
- vLLM (LMI 0.33+ continuous batching) takes `gpu_memory_utilization` of each GPU for weights, activations and
  a KV cache it allocates up front; tensor parallelism splits the KV heads.
- lmi-dist (LMI 0.23) has no memory share setting: it allocates from what is free; tensor parallel, heads split.
- accelerate (dynamic batching) has no share either; device_map places whole layers on GPUs, so each GPU holds
  the KV cache of its own layers, which grows with each request of the batch.
Every engine also needs room besides weights and KV cache (prefill activations, CUDA context, NCCL buffers):
RESERVE_GIB, an estimate; the headroom warning exists because it is one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from inference.llm.lmi.hardware import GIB, GPU_INSTANCES, Gpu, gpu_instance
from inference.llm.lmi.models import (
    DTYPE_BYTES,
    architecture,
    kv_bytes_per_token,
    kv_bytes_per_token_split_by_heads,
    kv_bytes_per_token_split_by_layers,
)
from inference.llm.lmi.versions import VLLM, backend
from settings import SettingsError
from settings.serving import FalconSettings

RESERVE_GIB = 1.0
# Below this share of KV room left unused, check() warns: a longer prompt mix or a fuller batch may not fit.
MIN_HEADROOM = 0.10


@dataclass(frozen=True)
class SizingReport:
    """GPU memory per GPU for one configuration, in the recipe's terms."""

    model_id: str
    dtype: str
    instance_type: str
    gpu: Gpu
    gpus: int
    tensor_parallel_degree: int
    runtime: str
    memory_share: float  # of each GPU the engine may use (1.0: no share setting)
    weights_gib: float
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    kv_split: str  # "heads" or "layers"
    request_tokens: int
    batch_setting: str
    configured_batch: int

    @property
    def weights_per_gpu_gib(self) -> float:
        return self.weights_gib / self.tensor_parallel_degree

    @property
    def weights_share(self) -> float:
        """Weights per GPU as a share of the memory CUDA can use on that GPU (the recipe's 84% / 43%)."""
        return self.weights_per_gpu_gib / self.gpu.usable_gib

    @property
    def budget_gib(self) -> float:
        return self.gpu.usable_gib * self.memory_share

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

    def _budget_words(self) -> str:
        if self.memory_share < 1:
            return f"{self.memory_share:g} x {self.gpu.usable_gib:.1f} GiB (vLLM gpu_memory_utilization)"
        return f"{self.gpu.usable_gib:.1f} GiB ({self.runtime} has no memory share)"

    def format_report(self) -> str:
        gpu = self.gpu
        batch = (f"largest batch {self.largest_batch:,}; {self.batch_setting}={self.configured_batch} "
                 f"uses {self.kv_use:.0%} of the KV room" if self.tokens_fit else "no KV room left")
        return "\n".join([
            f"{self.model_id} {self.dtype} on {self.instance_type} ({self.gpus}x {gpu.name}, "
            f"{gpu.usable_gib:.1f} GiB usable of {gpu.nominal_gib}), tensor parallel {self.tensor_parallel_degree}, "
            f"engine {self.runtime}",
            f"  weights   {self.weights_gib:.1f} GiB, {self.weights_per_gpu_gib:.1f} GiB per GPU "
            f"= {self.weights_share:.0%} of GPU memory",
            f"  KV cache  {self.kv_bytes_per_token:,} bytes per token ({self.kv_bytes_per_token_per_gpu:,} per GPU, "
            f"split by {self.kv_split})",
            f"  KV room   {self.kv_room_gib:.1f} GiB per GPU ({self._budget_words()} - weights - "
            f"{RESERVE_GIB:.1f} GiB reserve) = {self.tokens_fit:,} tokens",
            f"  requests  {self.request_tokens:,} tokens (input + new): {batch}",
        ])


def sizing(falcon: FalconSettings) -> SizingReport:
    """The numbers, whether or not they fit (check_memory turns a misfit into an error)."""
    gpu, gpus = gpu_instance(falcon.instance_type)
    arch = architecture(falcon)
    runtime = backend(falcon.lmi_version, falcon.batching).runtime
    dynamic = falcon.batching == "dynamic"
    tp = falcon.tensor_parallel_degree
    by_heads = not dynamic  # accelerate places layers; lmi-dist and vLLM split heads
    return SizingReport(
        model_id=falcon.model_id + (f" (architecture of {falcon.model_config})" if falcon.model_config else ""),
        dtype=falcon.dtype, instance_type=falcon.instance_type, gpu=gpu, gpus=gpus,
        tensor_parallel_degree=tp, runtime=runtime,
        memory_share=falcon.gpu_memory_utilization if runtime == VLLM else 1.0,
        weights_gib=arch.parameters_billion * 1e9 * DTYPE_BYTES[falcon.dtype] / GIB,
        kv_bytes_per_token=kv_bytes_per_token(arch, falcon.dtype),
        kv_bytes_per_token_per_gpu=(kv_bytes_per_token_split_by_heads(arch, falcon.dtype, tp) if by_heads
                                    else kv_bytes_per_token_split_by_layers(arch, falcon.dtype, tp)),
        kv_split="heads" if by_heads else "layers",
        request_tokens=falcon.max_input_tokens + falcon.max_new_tokens,
        batch_setting="batch_size" if dynamic else "max_rolling_batch_size",
        configured_batch=falcon.batch_size if dynamic else falcon.max_rolling_batch_size,
    )


def check_memory(falcon: FalconSettings) -> list[str]:
    """Weights must fit, the configured batch's KV cache must fit; little headroom is a warning."""
    report = sizing(falcon)
    where = (f"{falcon.model_id} {falcon.dtype} with tensor parallel {falcon.tensor_parallel_degree} "
             f"({report.runtime})")
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
            f"{falcon.tensor_parallel_degree} ({report.runtime}) holds {report.tokens_fit:,} tokens, "
            f"{report.largest_batch} requests of {falcon.max_input_tokens} + {falcon.max_new_tokens} tokens")
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
