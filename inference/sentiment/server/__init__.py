"""The sentiment endpoint's own server: uvicorn + Starlette, batching across requests, SageMaker's contract.

`python -m inference.sentiment.server serve` is the serving image's entry point and `make serve-local`'s.
Modules: `config` (settings from the environment), `batcher` (bounded queue, one inference thread), `model`
(load at the recorded precision, answer a batch), `app` (HTTP), `worker` (one process), `__main__` (supervisor).
"""
