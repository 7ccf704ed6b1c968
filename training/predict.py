"""Classify sentences with a saved model directory; used after training and as a quick check."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def classify(model_dir: str | Path, texts: list[str], max_length: int = 128) -> list[tuple[str, float]]:
    """(label name, probability) for each text, using the model and tokenizer saved in model_dir."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.inference_mode():
        probabilities = model(**batch).logits.float().softmax(dim=-1)
    scores, indices = probabilities.max(dim=-1)
    return [(model.config.id2label[int(i)], float(s)) for i, s in zip(indices, scores, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.predict", description=classify.__doc__)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("texts", nargs="+", metavar="TEXT")
    args = parser.parse_args(argv)
    if not (Path(args.model_dir) / "config.json").is_file():
        print(
            f"python -m training.predict: error: --model-dir {args.model_dir}: no config.json, not a saved model",
            file=sys.stderr,
        )
        return 2
    for text, (label, score) in zip(args.texts, classify(args.model_dir, args.texts), strict=True):
        print(f"{label}\t{score:.2f}\t{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
