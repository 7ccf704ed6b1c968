"""What a client sends: one request body, and the one that streams tokens back (InvokeEndpointWithResponseStream).

- 0.33 and later (vLLM async service): `"stream": true` at the top level of the body
  (lmi_vllm/request_response_utils.py convert_lmi_schema_to_completion_request); the answer is JSON lines
  (application/jsonlines), one `{"index", "token": {"id", "text", "logprob"}, "generated_text": null, ...}` per
  token, the last with `generated_text`.
- 0.23 rolling batch: every answer is sent in chunks as tokens come (engines/python/.../RollingBatch.java,
  ChunkedBytesSupplier), no request flag. With option.output_formatter=json (default) the chunks form one JSON
  document `{"generated_text": "..."}`; with jsonlines (falcon.output_formatter) each chunk is one line, a JSON
  array of token texts (rolling_batch/rolling_batch.py).
- Dynamic batching streams nothing: 0.23's enable_streaming serves one request per batch, 0.33+ refuse
  streaming with batch_size > 1 (properties_manager/properties.py).
- Exact output token counts (`details_supported`): 0.33+ vLLM (0.33.0-dlc 8b3b685b, 0.35.0-dlc 63786613,
  0.36.0-lmi27-dlc 7e13b081, `lmi_vllm/request_response_utils.py` convert_lmi_schema_to_completion_request) pops
  `parameters.details` and then reports `details.generated_tokens`: whole, vLLM's usage.completion_tokens
  (convert_completion_response_to_lmi_schema); streamed, on the last line, usage.completion_tokens + 1
  (convert_completion_chunk_response_to_lmi_schema), where vLLM's continuous usage is already the running total
  including that line's tokens (vllm/entrypoints/openai/serving_completion.py completion_stream_generator, read at
  vllm-project/vllm 2d5f987d and 00463e62), so one more than generated (inference.llm.stream corrects it).
  0.23's lmi-dist formatters (rolling_batch/rolling_batch.py) write token text only, and dynamic batching's
  transformers pipeline (huggingface.py) writes `generated_text` only: no details there, so none is asked.
"""

from __future__ import annotations

import json

from inference.llm.lmi.versions import LMI_DIST, VERSIONS, VLLM, backend
from settings.serving import FalconSettings

PROMPT = "What is Amazon SageMaker?"
MAX_NEW_TOKENS = 128  # LMI's default is 30: always send it


def request_body(falcon: FalconSettings, prompt: str = PROMPT, max_new_tokens: int = MAX_NEW_TOKENS) -> str:
    return json.dumps({"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens}})


def streaming_request_body(falcon: FalconSettings, prompt: str = PROMPT,
                           max_new_tokens: int = MAX_NEW_TOKENS) -> str | None:
    """The body that streams tokens in this configuration, or None where nothing streams (dynamic batching)."""
    runtime = backend(falcon.lmi_version, falcon.batching).runtime
    body: dict = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens}}
    if runtime == VLLM:
        return json.dumps({**body, "stream": True})
    if runtime == LMI_DIST:
        return json.dumps(body)
    return None


def details_supported(lmi_version: str, batching: str) -> bool:
    """Whether LMI answers `"details": true` with details.generated_tokens in this version and batching mode
    (module docstring). Unknown versions and modes a version refuses: False (never ask what may be refused)."""
    spec = VERSIONS.get(lmi_version)
    if spec is None or batching in spec.refused or batching not in spec.backends:
        return False
    return spec.backends[batching].runtime == VLLM
