"""The handler under the real SageMaker inference toolkit, and random JSON thrown at input_fn/predict_fn."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GOOD = b'{"inputs": ["happy days", "so sad"]}'


class _RequestProcessor:
    def __init__(self, headers):
        self._headers = headers

    def get_request_properties(self):
        return self._headers


class _Context:
    """The slice of the model server's context that `Transformer.transform` uses."""

    def __init__(self, model_dir, headers):
        self.system_properties = {"model_dir": model_dir}
        self.request_processor = [_RequestProcessor(headers)]
        self.status = (200, "OK")
        self.content_type = None

    def set_response_status(self, code, phrase):
        self.status = (code, phrase)

    def set_response_content_type(self, index, content_type):
        self.content_type = content_type


@pytest.fixture(scope="module")
def toolkit(handler, extracted):
    """The toolkit's Transformer, importing the shipped handler as the module named by SAGEMAKER_PROGRAM."""
    from sagemaker_inference import transformer

    saved = sys.modules.get("inference")
    sys.modules["inference"] = handler  # the container imports code/inference.py as `inference`
    try:
        instance = transformer.Transformer()

        def transform(body, content_type="application/json", accept="application/json"):
            headers = {"Accept": accept} if accept else {}
            if content_type:
                headers["Content-Type"] = content_type
            context = _Context(str(extracted), headers)
            (response,) = instance.transform([{"body": body}], context)
            return context, response

        transform(GOOD)  # loads the model through model_fn while the module is in place
        yield transform
    finally:
        if saved is not None:
            sys.modules["inference"] = saved
        else:
            sys.modules.pop("inference", None)


def test_toolkit_answers_good_requests_as_json(toolkit):
    context, response = toolkit(GOOD, accept="*/*")
    assert context.status[0] == 200
    assert context.content_type == "application/json"
    assert [set(result) for result in json.loads(response)] == [{"label", "score"}] * 2


@pytest.mark.parametrize(
    ("body", "content_type", "accept", "status"),
    [
        (GOOD, "text/csv", "application/json", 415),
        (b'{"inputs": [', "application/json", "application/json", 400),
        (b'{"inputs": "caf\xe9"}', "application/json; charset=utf-8", "application/json", 400),
        (b'{"inputs": []}', "application/json", "application/json", 400),
        (json.dumps({"inputs": ["a"] * 65}).encode(), "application/json", "application/json", 413),
        (b'{"inputs": "a", "parameters": {"top_k": 9}}', "application/json", "application/json", 422),
        (GOOD, "application/json", "text/csv", 406),
    ],
)
def test_toolkit_turns_client_errors_into_their_status(toolkit, body, content_type, accept, status):
    context, response = toolkit(body, content_type, accept)
    assert context.status[0] == status
    first_line = response.splitlines()[0]  # the toolkit appends a traceback after the message
    assert json.loads(first_line)["status"] == status
    assert toolkit(GOOD)[0].status[0] == 200


# Random JSON: scalars, lists and objects, nested, plus objects shaped almost like requests.
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)
INPUTS = JSON_VALUES | st.text(max_size=60) | st.lists(st.text(max_size=60), max_size=6)
PARAMETERS = JSON_VALUES | st.fixed_dictionaries({}, optional={"top_k": st.integers(-2, 5) | JSON_VALUES})
REQUESTS = JSON_VALUES | st.fixed_dictionaries(
    {"inputs": INPUTS}, optional={"parameters": PARAMETERS, "extra": JSON_VALUES}
)
CONTENT_TYPES = st.sampled_from(
    [None, "application/json", "application/json; charset=utf-8", "text/plain", "application/jsonl", ""]
)


def _check(handler, loaded, body, content_type):
    """Only ClientError may escape; anything that passes comes back as one well-formed result per text."""
    try:
        request = handler.input_fn(body, content_type)
        prediction = handler.predict_fn(request, loaded)
    except handler.ClientError as error:
        assert 400 <= error.status_code < 500
        assert json.loads(error.message)["status"] == error.status_code
        return
    assert len(prediction) == len(request.texts)
    for result in prediction:
        entries = result if request.top_k is not None else [result]
        assert len(entries) == (request.top_k or 1)
        for entry in entries:
            assert entry["label"] in loaded.labels and 0.0 <= entry["score"] <= 1.0
    json.loads(handler.output_fn(prediction, "application/json")[0])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=REQUESTS, content_type=CONTENT_TYPES)
def test_random_json_only_ever_raises_client_errors(handler, loaded, payload, content_type):
    _check(handler, loaded, json.dumps(payload).encode(), content_type)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=80) | st.text(max_size=80))
def test_random_bytes_only_ever_raise_client_errors(handler, loaded, body):
    _check(handler, loaded, body, "application/json")
