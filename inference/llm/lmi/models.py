"""The model catalogue: the architecture numbers the memory sizing needs, per Hugging Face model id."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settings import SettingsError
from settings.serving import FalconSettings


@dataclass(frozen=True)
class Architecture:
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    parameters_billion: float
    model_type: str = ""  # config.json model_type: vLLM refuses float16 for some (vllm.py)
    max_position_embeddings: int | None = None  # the context vLLM derives when rope scaling does not extend it


@dataclass(frozen=True)
class CatalogueModel:
    architecture: Architecture
    licence: str  # as the model card states it (read from the cards, not re-checked here: no hub access)


_FALCON_40B = Architecture(layers=60, attention_heads=128, kv_heads=8, head_dim=64, parameters_billion=41.84,
                           model_type="falcon", max_position_embeddings=2048)
_FALCON_7B = Architecture(layers=32, attention_heads=71, kv_heads=1, head_dim=64, parameters_billion=6.92,
                          model_type="falcon", max_position_embeddings=2048)
_QWEN3_8B = Architecture(layers=36, attention_heads=32, kv_heads=8, head_dim=128, parameters_billion=8.19,
                         model_type="qwen3", max_position_embeddings=40960)
_QWEN3_4B = Architecture(layers=36, attention_heads=32, kv_heads=8, head_dim=128, parameters_billion=4.02,
                         model_type="qwen3", max_position_embeddings=40960)
_MISTRAL_7B = Architecture(layers=32, attention_heads=32, kv_heads=8, head_dim=128, parameters_billion=7.25,
                           model_type="mistral", max_position_embeddings=32768)
# Falcon is the recipe's; the others are current, permissively licensed decoders that fit the smoke instance
# (one 24 GB A10G) and the prod one (g5.48xlarge, tensor parallel 8 divides their heads).
MODELS: dict[str, CatalogueModel] = {
    "tiiuae/falcon-40b": CatalogueModel(_FALCON_40B, "Apache-2.0"),
    "tiiuae/falcon-40b-instruct": CatalogueModel(_FALCON_40B, "Apache-2.0"),
    "tiiuae/falcon-7b": CatalogueModel(_FALCON_7B, "Apache-2.0"),
    "tiiuae/falcon-7b-instruct": CatalogueModel(_FALCON_7B, "Apache-2.0"),
    "Qwen/Qwen3-8B": CatalogueModel(_QWEN3_8B, "Apache-2.0"),
    "Qwen/Qwen3-4B": CatalogueModel(_QWEN3_4B, "Apache-2.0"),
    "mistralai/Mistral-7B-Instruct-v0.3": CatalogueModel(_MISTRAL_7B, "Apache-2.0"),
}
CATALOGUE: dict[str, Architecture] = {model_id: entry.architecture for model_id, entry in MODELS.items()}
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
    """falcon.model_config's numbers, else the catalogue's for model_id, each overridable by the model_* settings;
    a model in neither must give all five."""
    given = {field: getattr(falcon, name) for name, field in _ARCHITECTURE_SETTINGS.items()
             if getattr(falcon, name) is not None}
    base = from_config_file(falcon.model_config) if falcon.model_config else CATALOGUE.get(falcon.model_id)
    if base is not None:
        return dataclasses.replace(base, **given)
    missing = [f"falcon.{name}" for name, field in _ARCHITECTURE_SETTINGS.items() if field not in given]
    if missing:
        raise SettingsError(missing[0], None, f"the architecture of {falcon.model_id}, which is not in the "
                            f"catalogue ({', '.join(sorted(CATALOGUE))}): set falcon.model_config to its "
                            f"config.json, or {', '.join(missing)}")
    return Architecture(**given)


# MLPs with two matrices (up, down); the others gate (gate, up, down), as Llama, Mistral and Qwen do.
_UNGATED_MLP = {"falcon", "RefinedWeb", "RefinedWebModel", "gpt_neox", "gpt2", "gptj", "gpt_bigcode", "opt",
                "bloom", "mpt", "phi", "starcoder2"}


def _first(config: dict, *keys: str) -> Any:
    return next((config[key] for key in keys if config.get(key) is not None), None)


def from_config(config: dict, where: str = "falcon.model_config") -> Architecture:
    """A decoder's numbers from its Hugging Face config.json (nested text_config for multimodal wrappers).

    Parameters are estimated from the shapes (embeddings, attention, MLP times experts), which is what the weights
    take in memory to within norms and biases; set falcon.model_parameters_billion for the exact count.
    """
    config = {**config, **(config.get("text_config") or {})}
    model_type = str(config.get("model_type", ""))
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(config, "num_attention_heads", "n_head")
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(hidden, int)):
        raise SettingsError(where, None, "a decoder's config.json with num_hidden_layers, num_attention_heads and "
                            "hidden_size (or their Falcon/GPT names)")
    if config.get("new_decoder_architecture"):  # Falcon-40B style: grouped KV heads under num_kv_heads
        kv_heads = _first(config, "num_kv_heads", "n_head_kv") or heads
    elif config.get("multi_query"):  # Falcon-7B style: one KV head
        kv_heads = 1
    else:
        kv_heads = _first(config, "num_key_value_heads", "num_kv_heads", "n_head_kv") or heads
    head_dim = _first(config, "head_dim") or hidden // heads
    vocab = _first(config, "vocab_size") or 0
    intermediate = _first(config, "intermediate_size", "ffn_hidden_size", "n_inner") or 4 * hidden
    experts = _first(config, "num_local_experts", "num_experts") or 1
    attention = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    mlp = (2 if model_type in _UNGATED_MLP else 3) * hidden * intermediate * experts
    tied = config.get("tie_word_embeddings", model_type in _UNGATED_MLP)
    embeddings = vocab * hidden * (1 if tied else 2)
    parameters = embeddings + layers * (attention + mlp + 2 * hidden)
    rope_scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    extended = isinstance(rope_scaling, dict) and rope_scaling.get("rope_type", rope_scaling.get("type")) not in (
        None, "default")
    max_len = _first(config, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
    return Architecture(layers=layers, attention_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                        parameters_billion=round(parameters / 1e9, 3), model_type=model_type,
                        max_position_embeddings=None if extended or not isinstance(max_len, int) else max_len)


@functools.cache
def from_config_file(path: str) -> Architecture:
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise SettingsError("falcon.model_config", path, f"a readable config.json ({error})") from None
    if not isinstance(config, dict):
        raise SettingsError("falcon.model_config", path, "a config.json holding a JSON object")
    return from_config(config)


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
