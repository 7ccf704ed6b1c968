"""RoBERTa tweet-sentiment training, packaging and benchmarking for the SageMaker recipe."""

from common.library_warnings import drop_unactionable_library_warnings

# Before any training entry point loads transformers (which imports torchao): see that module.
drop_unactionable_library_warnings()

LABELS = ("negative", "neutral", "positive")
"""Class names in label order; the hub dataset and the shipped sample use 0, 1, 2."""

ID2LABEL = dict(enumerate(LABELS))
LABEL2ID = {name: index for index, name in ID2LABEL.items()}
