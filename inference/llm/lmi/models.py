"""The model catalogue: the architecture numbers the memory sizing needs, per Hugging Face model id."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from settings import FalconSettings, SettingsError


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


def kv_bytes_per_token(arch: Architecture, dtype: str) -> int:
    """KV cache bytes one token takes in the whole model: 2 (K and V) x layers x KV heads x head_dim x bytes."""
    return 2 * arch.layers * arch.kv_heads * arch.head_dim * DTYPE_BYTES[dtype]


def kv_bytes_per_token_split_by_heads(arch: Architecture, dtype: str, tensor_parallel_degree: int) -> int:
    """Per GPU under tensor parallelism, which splits KV heads across GPUs.

    With fewer KV heads than GPUs each GPU keeps a copy of one head (multi-query Falcon-7B keeps its single head
    on every GPU), so the per-GPU cost never drops below one head.
    """
    heads_per_gpu = arch.kv_heads / tensor_parallel_degree if arch.kv_heads >= tensor_parallel_degree else 1
    return int(2 * arch.layers * heads_per_gpu * arch.head_dim * DTYPE_BYTES[dtype])


def kv_bytes_per_token_split_by_layers(arch: Architecture, dtype: str, gpus: int) -> int:
    """Per GPU under layer placement (accelerate's device_map): each GPU holds the KV of its own layers."""
    return math_ceil_div(arch.layers, gpus) * 2 * arch.kv_heads * arch.head_dim * DTYPE_BYTES[dtype]


def math_ceil_div(a: int, b: int) -> int:
    return -(-a // b)
