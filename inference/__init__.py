"""Serving code, one package per product: `inference.sentiment` (the Graviton endpoint) and `inference.llm` (LMI)."""
