"""The handler (inference/sentiment/inference.py, our server's request and response library): round trip, contract
details, client errors, on a model packaged by training.package."""

from __future__ import annotations

import json

import pytest

LABELS = {"negative", "neutral", "positive"}
GOOD = {"inputs": ["What a wonderful morning!", "The train is late again.", "Meeting at noon."]}


def _assert_result(result):
    assert set(result) == {"label", "score"}
    assert result["label"] in LABELS
    assert 0.0 <= result["score"] <= 1.0


def test_model_fn_reads_labels_and_limits_from_the_archive(loaded):
    assert loaded.labels == ("negative", "neutral", "positive")
    assert loaded.max_length == 512  # 514 position slots less RoBERTa's padding offset of 2
    assert loaded.threads >= 1
    assert loaded.model.training is False


def test_round_trip_returns_one_result_per_input_in_order(invoke):
    results = invoke(GOOD)
    assert len(results) == 3
    for result in results:
        _assert_result(result)
    # Order and padding: each text alone scores the same as inside the padded batch.
    for text, batched in zip(GOOD["inputs"], results, strict=True):
        alone = invoke({"inputs": [text]})[0]
        assert alone["label"] == batched["label"]
        assert alone["score"] == pytest.approx(batched["score"], abs=1e-4)


def test_single_string_gives_a_one_element_list(invoke):
    results = invoke({"inputs": "Covid cases are increasing fast!"})
    assert isinstance(results, list) and len(results) == 1
    _assert_result(results[0])


def test_top_k_gives_the_best_labels_in_order(invoke):
    results = invoke({"inputs": ["good", "bad"], "parameters": {"top_k": 3}})
    assert len(results) == 2
    for ranked in results:
        assert [entry["label"] for entry in ranked] != [] and {entry["label"] for entry in ranked} == LABELS
        scores = [entry["score"] for entry in ranked]
        assert scores == sorted(scores, reverse=True)
        assert sum(scores) == pytest.approx(1.0, abs=1e-5)
    best = invoke({"inputs": ["good"], "parameters": {"top_k": 1}})
    assert len(best[0]) == 1 and best[0][0]["label"] == invoke({"inputs": ["good"]})[0]["label"]


@pytest.mark.parametrize(
    ("content_type", "accept"),
    [
        ("application/json; charset=utf-8", "*/*"),
        ("Application/JSON", "application/json, text/plain;q=0.5"),
        (None, None),
        ("application/json", "application/*"),
    ],
)
def test_content_type_and_accept_variants(invoke, content_type, accept):
    assert len(invoke(GOOD, content_type, accept)) == 3


def test_str_body_and_bytearray_body_are_accepted(handler, loaded):
    for body in (json.dumps(GOOD), bytearray(json.dumps(GOOD).encode())):
        assert len(handler.predict_fn(handler.input_fn(body, "application/json"), loaded)) == 3


def test_long_text_is_truncated_not_rejected(invoke, loaded):
    text = "word " * 999  # under MAX_TEXT_CHARS, far over the model's 512 tokens
    assert len(loaded.tokenizer(text)["input_ids"]) > loaded.max_length
    _assert_result(invoke({"inputs": [text, "short"]})[0])


# (body, content type, expected status); each is followed by a good request in the test.
BAD_REQUESTS = {
    "wrong content type": (GOOD, "text/csv", 415),
    "form content type": (GOOD, "application/x-www-form-urlencoded", 415),
    "non-utf-8 charset": (GOOD, "application/json; charset=latin-1", 415),
    "malformed JSON": (b'{"inputs": ["unclosed"', "application/json", 400),
    "not UTF-8": (b'{"inputs": "caf\xe9"}', "application/json", 400),
    "empty body": (b"", "application/json", 400),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "application/json", 400),
    "JSON array": (["text"], "application/json", 400),
    "JSON string": (b'"text"', "application/json", 400),
    "missing inputs": ({"text": "hello"}, "application/json", 400),
    "null inputs": ({"inputs": None}, "application/json", 400),
    "empty list": ({"inputs": []}, "application/json", 400),
    "empty string": ({"inputs": ""}, "application/json", 400),
    "empty item": ({"inputs": ["ok", ""]}, "application/json", 400),
    "number item": ({"inputs": ["ok", 3]}, "application/json", 400),
    "nested list item": ({"inputs": [["a"]]}, "application/json", 400),
    "object inputs": ({"inputs": {"text": "a"}}, "application/json", 400),
    "lone surrogate": (b'{"inputs": "\\ud800"}', "application/json", 400),
    "too many items": ({"inputs": ["a"] * 65}, "application/json", 413),
    "text too long": ({"inputs": ["x" * 5001]}, "application/json", 413),
    "parameters not an object": ({"inputs": "a", "parameters": [1]}, "application/json", 400),
    "unknown parameter": ({"inputs": "a", "parameters": {"top_kk": 1}}, "application/json", 400),
    "top_k bool": ({"inputs": "a", "parameters": {"top_k": True}}, "application/json", 400),
    "top_k string": ({"inputs": "a", "parameters": {"top_k": "2"}}, "application/json", 400),
    "top_k float": ({"inputs": "a", "parameters": {"top_k": 2.0}}, "application/json", 400),
    "top_k zero": ({"inputs": "a", "parameters": {"top_k": 0}}, "application/json", 422),
    "top_k negative": ({"inputs": "a", "parameters": {"top_k": -1}}, "application/json", 422),
    "top_k over labels": ({"inputs": "a", "parameters": {"top_k": 4}}, "application/json", 422),
    "top_k huge": ({"inputs": "a", "parameters": {"top_k": 10**30}}, "application/json", 422),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_is_a_client_error_and_the_next_request_works(handler, loaded, invoke, case):
    body, content_type, status = BAD_REQUESTS[case]
    if isinstance(body, dict | list):
        body = json.dumps(body).encode()
    with pytest.raises(handler.ClientError) as raised:
        handler.predict_fn(handler.input_fn(body, content_type), loaded)
    error = raised.value
    assert error.status_code == status
    assert "\n" not in error.message
    assert json.loads(error.message) == {"error": error.error, "status": status}
    assert len(error.message) < 300  # never echoes a whole request back
    assert len(invoke(GOOD)) == 3


def test_unacceptable_accept_is_406(handler, loaded):
    prediction = handler.predict_fn(handler.input_fn(json.dumps(GOOD), "application/json"), loaded)
    for accept in ("text/csv", "application/json;q=0", "text/html, application/xml"):
        with pytest.raises(handler.ClientError) as raised:
            handler.output_fn(prediction, accept)
        assert raised.value.status_code == 406


def test_limits_come_from_the_environment(invoke, monkeypatch, handler):
    monkeypatch.setenv("MAX_BATCH", "2")
    monkeypatch.setenv("MAX_TEXT_CHARS", "10")
    monkeypatch.setenv("MAX_TOP_K", "2")
    assert len(invoke({"inputs": ["0123456789", "ok"], "parameters": {"top_k": 2}})) == 2
    for body, status in [
        ({"inputs": ["a", "b", "c"]}, 413),
        ({"inputs": ["01234567890"]}, 413),
        ({"inputs": ["a"], "parameters": {"top_k": 3}}, 422),
    ]:
        with pytest.raises(handler.ClientError) as raised:
            handler.input_fn(json.dumps(body), "application/json")
        assert raised.value.status_code == status


def test_bad_limit_in_the_environment_stops_model_fn(handler, extracted, monkeypatch):
    monkeypatch.setenv("MAX_BATCH", "many")
    with pytest.raises(ValueError, match="MAX_BATCH"):
        handler.model_fn(str(extracted))


def test_threads_follow_omp_num_threads_or_cpus_per_worker(handler, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert handler.thread_count() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(handler, "_usable_cpus", lambda: 16)
    monkeypatch.setenv("SAGEMAKER_MODEL_SERVER_WORKERS", "4")
    assert handler.thread_count() == 4
    monkeypatch.setenv("SAGEMAKER_MODEL_SERVER_WORKERS", "32")
    assert handler.thread_count() == 1


def test_label_names_are_lowercase_and_generic_names_become_sentiments(handler):
    assert handler.label_names({0: "NEGATIVE", 1: "Neutral", 2: "positive"}) == ("negative", "neutral", "positive")
    assert handler.label_names({"1": "LABEL_1", "0": "LABEL_0", "2": "LABEL_2"}) == handler.SENTIMENT_LABELS
    assert handler.label_names({0: "LABEL_0", 1: "LABEL_1"}) == ("label_0", "label_1")


def test_max_input_length_uses_the_tighter_limit(handler):
    from types import SimpleNamespace

    roberta = SimpleNamespace(model_type="roberta", max_position_embeddings=514, pad_token_id=1)
    assert handler.max_input_length(SimpleNamespace(model_max_length=int(1e30)), roberta) == 512
    assert handler.max_input_length(SimpleNamespace(model_max_length=128), roberta) == 128
    bert = SimpleNamespace(model_type="bert", max_position_embeddings=512, pad_token_id=0)
    assert handler.max_input_length(SimpleNamespace(model_max_length=int(1e30)), bert) == 512


def test_client_error_matches_the_toolkit_constructor(handler):
    error = handler.ClientError(413, "too big")
    assert (error.status_code, error.phrase) == (413, "Request Entity Too Large")
    assert isinstance(error, handler._ToolkitError)
    from sagemaker_inference import errors as toolkit

    assert isinstance(error, toolkit.GenericInferenceToolkitError)
    assert isinstance(error, toolkit.BaseInferenceToolkitError)


def test_length_buckets_give_one_padded_batch_s_answers_in_input_order(handler, loaded):
    import torch

    texts = ["ok", "a much longer text " * 12, "mid length text here", "x", *[f"text number {i} " * (i % 5 + 1)
                                                                           for i in range(14)]]
    answers = handler.predict_fn(handler.Request(texts, top_k=3), loaded)
    batch = loaded.tokenizer(texts, padding=True, truncation=True, max_length=loaded.max_length, return_tensors="pt")
    with torch.inference_mode():
        expected = loaded.model(**batch).logits.softmax(dim=-1)
    for row, probabilities in zip(answers, expected.tolist(), strict=True):
        for entry in row:
            assert abs(entry["score"] - probabilities[loaded.labels.index(entry["label"])]) < 1e-4


def _partitions(count: int):
    """Every way to cut range(count) into contiguous [start, end) pieces."""
    if count == 0:
        yield []
        return
    for start in range(count):
        for rest in _partitions(start):
            yield [*rest, (start, count)]


def test_bucket_plan_is_the_cheapest_split_of_the_sorted_lengths():
    import random

    from inference.sentiment.inference import plan_buckets

    def cost(lengths, plan, pass_cost):
        return sum((end - start) * lengths[end - 1] + pass_cost for start, end in plan)

    rng = random.Random(7)
    for _ in range(200):
        lengths = sorted(rng.randint(1, 120) for _ in range(rng.randint(1, 8)))
        pass_cost = rng.choice((0, 8, 32, 100))
        plan = plan_buckets(lengths, pass_cost)
        assert [start for start, _ in plan] == [0, *[end for _, end in plan[:-1]]]  # contiguous, in order
        assert plan[-1][1] == len(lengths)
        best = min(cost(lengths, candidate, pass_cost) for candidate in _partitions(len(lengths)))
        assert cost(lengths, plan, pass_cost) == best
    assert plan_buckets([10, 10, 10, 100], 32) == [(0, 3), (3, 4)]  # the long text alone
    assert plan_buckets([40, 41, 42, 43], 32) == [(0, 4)]  # similar lengths: one pass
    assert plan_buckets([]) == []
    many = plan_buckets([20] * 150)  # at most MAX_BUCKET_TEXTS per pass: three passes, covering all
    assert len(many) == 3 and all(end - start <= 64 for start, end in many) and many[-1][1] == 150
