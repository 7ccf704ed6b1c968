"""The sentiment endpoint's own server: uvicorn + Starlette, batching across requests, SageMaker's contract.

`python -m inference.sentiment.server serve` is the serving image's entry point and `make serve-local`'s.
Modules: `config` (settings from the environment), `batcher` (one bounded queue feeding every model replica, and
their watchdog), `model` (load at the recorded precision, tokenize, answer a batch), `app` (HTTP), `__main__` (the
one server process: start, serve, drain).
"""
