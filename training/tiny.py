"""A tiny RoBERTa and a tokenizer trained on the fly, so the whole pipeline runs on a CPU offline.

The architecture and tokenizer files are the same kind as `roberta-base`'s, just small, so what
works here (saving, reloading, packaging, serving) works for the real model too.
"""

from __future__ import annotations

from collections.abc import Iterable

from training import ID2LABEL, LABEL2ID

TINY_MODEL_NAME = "tiny"
# RoBERTa-base's dimensions with random weights and the same locally trained tokenizer: the GPU benchmark's model,
# which needs no download (the benchmark measures speed, not what a pretrained model knows).
RANDOM_BASE_MODEL_NAME = "random-base"
# RoBERTa-base's 12 layers (so its 201 parameter tensors and its modules) at the tiny model's width: a base step's
# host work (Python walks over modules and parameters, one call per tensor) with little arithmetic, so a CPU measures
# what the Trainer adds to a host-bound GPU step, which the 2-layer tiny model understates.
NARROW_BASE_MODEL_NAME = "narrow-base"
LOCAL_MODELS = (TINY_MODEL_NAME, RANDOM_BASE_MODEL_NAME, NARROW_BASE_MODEL_NAME)
SIZES = {
    TINY_MODEL_NAME: {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128},
    RANDOM_BASE_MODEL_NAME: {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                             "intermediate_size": 3072},
    NARROW_BASE_MODEL_NAME: {"hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 2,
                             "intermediate_size": 128},
}
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def build_tokenizer(texts: Iterable[str], vocab_size: int = 2000, model_max_length: int = 512):
    """A byte-level BPE RoBERTa tokenizer trained on `texts` (a few hundred lines take < 1 s)."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    bpe.train_from_iterator(
        list(texts), vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    # Positional: this binding rejects the documented keyword names.
    bpe.post_processor = RobertaProcessing(("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>")))
    return RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, model_max_length=model_max_length)


def build_model(tokenizer, max_length: int = 512, seed: int = 42, name: str = TINY_MODEL_NAME):
    """A randomly initialised RoBERTa classifier for the three sentiment classes: 2 layers, 64 wide (tiny),
    RoBERTa-base's 12 layers, 768 wide (random-base), or 12 layers, 64 wide (narrow-base)."""
    import torch
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(
        vocab_size=len(tokenizer),
        **SIZES[name],
        # RoBERTa numbers positions from padding_idx + 1, so two slots more than the longest input.
        max_position_embeddings=max_length + 2,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        num_labels=len(ID2LABEL),
        id2label=dict(ID2LABEL),
        label2id=dict(LABEL2ID),
        problem_type="single_label_classification",
    )
    torch.manual_seed(seed)
    return RobertaForSequenceClassification(config)
