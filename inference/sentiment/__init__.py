"""Sentiment serving: the SageMaker handler, its server and local stack, a client, the accuracy gate, a benchmark."""
