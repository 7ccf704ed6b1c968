"""Serving the sentiment model: the SageMaker handler, a local server, a client and a benchmark."""
