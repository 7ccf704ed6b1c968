"""The baseline for `make bench-handler`: what the Hugging Face inference toolkit's default handler does.

sagemaker-huggingface-inference-toolkit (`handler_service.py`, `HuggingFaceHandlerService`) loads a transformers
`pipeline` for the task and per request calls `pipeline(inputs, **parameters)` on the decoded JSON. For a list
of texts the text-classification pipeline runs one forward pass per text. Shipped as `code/inference.py` of the
baseline's archive (`training.package --handler`), it runs under TorchServe and the SageMaker PyTorch toolkit with
the toolkit's own handler service (`inference.sentiment.local_stack`).
"""

import json


def model_fn(model_dir):
    from transformers import pipeline

    return pipeline("text-classification", model=model_dir, device="cpu")


def input_fn(request_body, request_content_type):
    return json.loads(request_body)


def predict_fn(data, model):
    inputs = data.pop("inputs", data)
    parameters = data.pop("parameters", None)
    return model(inputs, **parameters) if parameters else model(inputs)


def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
