"""TorchServe handler service for the sentiment archive, shipped as `code/sentiment_service.py`.

It is the SageMaker PyTorch toolkit's own handler service (same `input_fn` -> `predict_fn` -> `output_fn`
path, same `code/inference.py` import) with two changes to what a client sees:

- A body that is not UTF-8, sent as `application/json` or `text/csv`, is a 400 with our one-line JSON. The
  toolkit decodes those two types itself before `input_fn` (sagemaker-pytorch-inference 2.0.25,
  `sagemaker_inference/transformer.py` `Transformer.transform`: `input_data.decode("utf-8")`), so the
  handler's own check never ran and the client got a 500.
- Error responses are one line of JSON, `{"error": "...", "status": N}`, with `Content-Type:
  application/json`. The toolkit's `handle_error` answers the message followed by a Python traceback and no
  content type; the traceback still goes to the log.

TorchServe selects it through `TS_DEFAULT_SERVICE_HANDLER=sentiment_service:handle` (set by the stack, see
`inference/sentiment/container.py`); the toolkit puts `/opt/ml/model/code` on the workers' PYTHONPATH. Like
`code/inference.py`, it imports nothing from this repository: only the toolkit that the image carries.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus

from sagemaker_inference import content_types, utils
from sagemaker_inference.errors import BaseInferenceToolkitError
from sagemaker_inference.transformer import Transformer

LOG = logging.getLogger(__name__)
JSON = "application/json"


class BadRequestBody(BaseInferenceToolkitError):
    """A body the toolkit would have failed to decode: a client mistake, 400."""

    def __init__(self, content_type: str, error: UnicodeDecodeError):
        message = error_line(400, f"request body is not valid UTF-8 (byte {error.start}); "
                                  f"{content_type} bodies must be UTF-8")
        super().__init__(400, message, HTTPStatus(400).phrase)


def error_line(status: int, error: str) -> str:
    """The one-line JSON every error response carries, the same shape as the handler's ClientError."""
    return json.dumps({"error": error, "status": status}, ensure_ascii=True)


def _is_error_line(message: str) -> bool:
    if "\n" in message:
        return False
    try:
        parsed = json.loads(message)
    except ValueError:
        return False
    return isinstance(parsed, dict) and set(parsed) == {"error", "status"}


class SentimentTransformer(Transformer):
    """The toolkit's Transformer: UTF-8 checked before the toolkit decodes, errors as one JSON line."""

    def transform(self, data, context):
        try:
            properties = context.request_processor[0].get_request_properties()
            content_type = utils.retrieve_content_type_header(properties)
            if content_type in content_types.UTF8_TYPES:
                for request in data:
                    body = request.get("body")
                    if isinstance(body, bytes | bytearray):
                        try:
                            body.decode("utf-8")
                        except UnicodeDecodeError as error:
                            raise BadRequestBody(content_type, error) from None
        except BadRequestBody as error:
            return self.handle_error(context, error, "")
        return super().transform(data, context)

    @staticmethod
    def handle_error(context, inference_exception, trace):
        status = int(inference_exception.status_code)
        message = str(inference_exception.message)
        if not _is_error_line(message):
            # Not one of our client errors: keep the detail in the log, tell the client only the class of failure.
            message = error_line(status, "internal error" if status >= 500 else message.splitlines()[0][:200])
        if trace:
            LOG.error("request failed with %d: %s\n%s", status, message, trace)
        context.set_response_status(code=status, phrase=utils.remove_crlf(str(inference_exception.phrase)))
        context.set_response_content_type(0, JSON)
        return [message + "\n"]


def _handler_service():
    """The PyTorch toolkit's HandlerService (multi-model path set-up included) with our Transformer.

    Imported here, not at the top: `inference.sentiment.serve` uses `SentimentTransformer` with the plain
    sagemaker-inference package, which has no PyTorch serving container.
    """
    from sagemaker_pytorch_serving_container.default_pytorch_inference_handler import (
        DefaultPytorchInferenceHandler,
    )
    from sagemaker_pytorch_serving_container.handler_service import HandlerService

    service = HandlerService()
    service._service = SentimentTransformer(default_inference_handler=DefaultPytorchInferenceHandler())
    return service


_service = None


def handle(data, context):
    """TorchServe's function entry point: called with no data once when the worker loads, then per batch."""
    global _service
    if _service is None:
        _service = _handler_service()
    if data is None:
        _service.initialize(context)  # model_fn runs here, as with the toolkit's own service
        return None
    return _service.handle(data, context)
