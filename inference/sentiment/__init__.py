"""Sentiment serving: the SageMaker handler, its server and local stack, a client, the accuracy gate, a benchmark."""

from common.library_warnings import drop_unactionable_library_warnings

# Before any of our entry points loads transformers (which imports torchao): see library_warnings.py.
drop_unactionable_library_warnings()
