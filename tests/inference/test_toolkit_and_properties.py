"""Random JSON thrown at the handler's input_fn/predict_fn: only client errors ever escape."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
