"""What the recipe published and how it measured, so our runs sit beside it (figures from /work/shared/FACTS.md).

Falcon-40B fp16 on ml.g5.48xlarge, tensor parallel 8, LMI: dynamic batching (batch_size 4, max_batch_delay
100 ms), continuous batching (max_rolling_batch_size 32, prefill tokens 1024) and continuous batching with
PagedAttention. The recipe reports output tokens/s and p90 latency per shape; it does not say how many clients
it ran, so our table shows our figures at the sweep's top concurrency and our best throughput of the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("dynamic", "rolling", "rolling_paged")  # falcon.batching values, in the recipe's order
MODE_NAMES = {"dynamic": "dynamic batching", "rolling": "continuous batching",
              "rolling_paged": "continuous + PagedAttention"}
SHAPES = ("32x128", "256x32")  # input x output tokens
RECIPE_MODEL, RECIPE_INSTANCE, RECIPE_TP = "tiiuae/falcon-40b", "ml.g5.48xlarge", 8
DEFAULT_CONCURRENCY = (1, 4, 16, 32)  # up to max_rolling_batch_size 32


@dataclass(frozen=True)
class Published:
    tokens_per_s: float
    p90_s: float


PUBLISHED: dict[tuple[str, str], Published] = {
    ("dynamic", "32x128"): Published(5.53, 58.34),
    ("rolling", "32x128"): Published(56.04, 4.74),
    ("rolling_paged", "32x128"): Published(59.18, 4.76),
    ("dynamic", "256x32"): Published(19.96, 59.31),
    ("rolling", "256x32"): Published(46.69, 3.88),
    ("rolling_paged", "256x32"): Published(44.75, 2.67),
}


# Continuous batching without PagedAttention exists only in LMI 0.23 (lmi-dist 1 has a paging switch); lmi-dist 2
# (0.27, 0.29) and vLLM (0.33 on) always page. inference.llm.lmi refuses `rolling` elsewhere at synth.
UNPAGED_ROLLING_VERSIONS = ("0.23.0",)


def default_modes(lmi_version: str) -> tuple[str, ...]:
    """Every mode the container version offers, in the recipe's order."""
    return MODES if lmi_version in UNPAGED_ROLLING_VERSIONS else ("dynamic", "rolling_paged")


def streams(mode: str) -> bool:
    """Whether LMI streams tokens per request in this mode: rolling batch only (see inference.llm.stream)."""
    return mode != "dynamic"


def differences(model_id: str, instance_type: str, tensor_parallel_degree: int) -> list[str]:
    """How these settings differ from the recipe's set-up; the published figures only compare when none do."""
    found = []
    if model_id != RECIPE_MODEL:
        found.append(f"model {model_id} (recipe: {RECIPE_MODEL})")
    if instance_type != RECIPE_INSTANCE:
        found.append(f"instance {instance_type} (recipe: {RECIPE_INSTANCE})")
    if tensor_parallel_degree != RECIPE_TP:
        found.append(f"tensor parallel {tensor_parallel_degree} (recipe: {RECIPE_TP})")
    return found
