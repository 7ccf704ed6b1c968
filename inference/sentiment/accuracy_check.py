"""Does an optimized handler setting answer like the unoptimized model? Run before turning `sentiment.quantize` on.

Loads the model twice through the handler's own `model_fn` (SENTIMENT_QUANTIZE=none, then the setting under
test), classifies every text of the shipped sample (training/data/sample/*.jsonl), and compares: the best
labels must agree on at least `--min-agreement` of the texts and every class probability must lie within
`--tolerance` of the unoptimized one. Exit status 0 when both hold, 1 when not, 2 for a bad model directory.

    python -m inference.sentiment.accuracy_check --model-dir artifacts/tiny-model --quantize int8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

PROG = "python -m inference.sentiment.accuracy_check"
SAMPLE_DIR = Path(__file__).resolve().parents[2] / "training" / "data" / "sample"
DEFAULT_MIN_AGREEMENT = 0.99
# Largest allowed change of any class probability; dynamic int8 on RoBERTa-base moves them by about 1e-2.
DEFAULT_TOLERANCE = 0.05


def sample_texts() -> list[str]:
    texts = []
    for path in sorted(SAMPLE_DIR.glob("*.jsonl")):
        texts += [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    return texts


def probabilities(model_dir: Path, quantize: str, texts: list[str]) -> tuple[tuple[str, ...], list[list[float]]]:
    """(labels, one probability row per text) from the handler loaded with SENTIMENT_QUANTIZE=quantize."""
    from inference.sentiment import inference as handler

    previous = os.environ.get("SENTIMENT_QUANTIZE")
    os.environ["SENTIMENT_QUANTIZE"] = quantize
    try:
        loaded = handler.model_fn(str(model_dir))
    finally:
        if previous is None:
            os.environ.pop("SENTIMENT_QUANTIZE")
        else:
            os.environ["SENTIMENT_QUANTIZE"] = previous
    rows = []
    count = len(loaded.labels)
    for start in range(0, len(texts), 32):
        ranked = handler.predict_fn(handler.Request(texts[start:start + 32], top_k=count), loaded)
        for entries in ranked:
            by_label = {entry["label"]: entry["score"] for entry in entries}
            rows.append([by_label[label] for label in loaded.labels])
    return loaded.labels, rows


def compare(reference: list[list[float]], candidate: list[list[float]]) -> tuple[float, float]:
    """(share of texts with the same best label, largest absolute probability difference)."""
    same = sum(max(range(len(a)), key=a.__getitem__) == max(range(len(b)), key=b.__getitem__)
               for a, b in zip(reference, candidate, strict=True))
    worst = max(abs(x - y) for a, b in zip(reference, candidate, strict=True) for x, y in zip(a, b, strict=True))
    return same / len(reference), worst


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-dir", required=True, type=Path, help="a saved model (the archive's root files)")
    parser.add_argument("--quantize", choices=("int8",), default="int8", help="the setting to check")
    parser.add_argument("--min-agreement", type=float, default=DEFAULT_MIN_AGREEMENT,
                        help="least share of texts whose best label must not change")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help="largest allowed change of any class probability")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not (args.model_dir / "config.json").is_file():
        print(f"{PROG}: error: --model-dir {args.model_dir}: no config.json, not a saved model", file=sys.stderr)
        return 2
    texts = sample_texts()
    labels, reference = probabilities(args.model_dir, "none", texts)
    _, candidate = probabilities(args.model_dir, args.quantize, texts)
    agreement, worst = compare(reference, candidate)
    passed = agreement >= args.min_agreement and worst <= args.tolerance
    print(f"{args.quantize} vs unoptimized on {len(texts)} sample texts ({', '.join(labels)}): labels agree on "
          f"{agreement:.1%} (need >= {args.min_agreement:.0%}); largest probability change {worst:.4f} "
          f"(allowed {args.tolerance}): {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
