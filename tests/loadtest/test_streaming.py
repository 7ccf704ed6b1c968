"""Answers as LMI sends them, per version and mode (bytes built by tests/fake_lmi.py from DJL Serving's formatter
rules), cut at random PayloadPart boundaries, decoded by botocore's own event-stream parser, and read by
inference.llm.stream; then the load test's figures from them."""

from __future__ import annotations

import csv
import http.client
import json

import boto3
import pytest
from botocore.exceptions import EventStreamError
from botocore.stub import ANY, Stubber

from inference.llm import loadtest
from inference.llm.stream import (
    chat_payload,
    error_body_message,
    read_stream,
    sagemaker_chunks,
    stream_payload,
    token_count,
)
from tests import fake_lmi
from tests.fake_lmi import FakeLmi, botocore_events, generated, sagemaker_runtime

pytestmark = pytest.mark.servers  # runs the load test against local streaming servers: make test's servers lane

VLLM_VERSIONS = ("0.33.0", "0.35.0", "0.36.0-lmi27")
SEEDS = range(12)


@pytest.fixture
def fake_aws(monkeypatch, tmp_path):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-west-2",
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def post(server: FakeLmi, payload: dict) -> tuple[int, bytes]:
    """The container's raw answer, before SageMaker."""
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    try:
        connection.request("POST", "/invocations", body=json.dumps(payload),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def through_sagemaker(data: bytes, seed: int):
    """`data` cut into random PayloadParts, parsed by botocore, read with one arrival time per part."""
    parts = list(sagemaker_chunks(botocore_events(data, seed)))
    assert b"".join(parts) == data
    return read_stream([(0.01 * number, part) for number, part in enumerate(parts, 1)]), parts


def test_random_cuts_fall_inside_lines_and_inside_utf8_characters():
    data = b"".join(fake_lmi.vllm_line([fake_lmi.token(n)], [], n == 8) for n in range(1, 9))
    inside_character = inside_line = False
    for seed in SEEDS:
        _answer, parts = through_sagemaker(data, seed)
        ends = [part[-1] for part in parts[:-1]]
        inside_character |= any(0x80 <= byte < 0xC0 or byte >= 0xC0 for byte in ends)
        inside_line |= any(not part.endswith(b"\n") for part in parts[:-1])
    assert inside_character and inside_line


# --- every version x mode x output form, read whole and right ---------------------------------------------

CASES = [(version, "dynamic", "json") for version in fake_lmi.VERSIONS] + \
        [("0.23.0", "rolling", "json"), ("0.23.0", "rolling", "jsonlines")] + \
        [(version, "rolling", "json") for version in VLLM_VERSIONS]


@pytest.mark.parametrize(("version", "mode", "formatter"), CASES)
@pytest.mark.parametrize("stream", [True, False])
def test_each_version_and_mode_is_read_through_random_payload_parts(version, mode, formatter, stream):
    with FakeLmi(mode, version=version, output_formatter=formatter, token_s=0.0005) as server:
        status, data = post(server, stream_payload("Tell me", 9, stream))
    assert status == 200
    streams = mode == "rolling" and (formatter == "jsonlines" if version == "0.23.0" else stream)
    for seed in SEEDS:
        answer, _parts = through_sagemaker(data, seed)
        assert answer.error is None, (seed, answer.error)
        assert answer.streamed is streams and answer.whole is not streams
        expected = ("Tell me" if mode == "dynamic" else "") + generated(9)
        assert answer.text == expected  # multi-byte characters intact, whatever the cuts
        if not streams:
            assert answer.ttft is None and answer.itl(9) == []


@pytest.mark.parametrize("version", fake_lmi.VERSIONS)
def test_dynamic_batching_with_stream_true_is_one_pretty_printed_document(version):
    """The held-out failure: `"stream": true` on dynamic batching gets Output._encode_json's indent=2 answer."""
    with FakeLmi("dynamic", version=version, token_s=0.0005) as server:
        _status, data = post(server, stream_payload("Hi", 4, True))
    assert data.startswith(b"[\n  {\n") and data.count(b"\n") >= 4
    for seed in SEEDS:
        answer, _ = through_sagemaker(data, seed)
        assert answer.whole and answer.final_text == "Hi" + generated(4) and answer.error is None


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_engine_failure_after_the_200_is_an_error_with_djls_message(version):
    with FakeLmi("rolling", version=version, token_s=0.0005) as server:
        server.fail_streams(1, after=3)
        status, data = post(server, stream_payload("Hi", 8, True))
    assert status == 200 and data.endswith(b'"cancelled":false}')
    for seed in SEEDS:
        answer, _ = through_sagemaker(data, seed)
        assert answer.error == "Inference Engine Failure (code 500)"
        assert answer.text == generated(3)  # what came before the failure is kept, and is not an answer


@pytest.mark.parametrize("formatter", ["json", "jsonlines"])
def test_lmi_dist_failure_record_is_an_error_with_djls_code(formatter):
    with FakeLmi("rolling", version="0.23.0", output_formatter=formatter, token_s=0.0005) as server:
        server.fail_streams(1, after=2)
        _status, data = post(server, stream_payload("Hi", 8, False))
    for seed in SEEDS:
        answer, _ = through_sagemaker(data, seed)
        assert answer.error == "Batch inference failed (code 424)"


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_merged_lines_are_counted_in_tokens_never_in_lines(version):
    with FakeLmi("rolling", version=version, merge=3, token_s=0.0005) as server:
        _status, data = post(server, stream_payload("Hi", 10, True))
    lines = [line for line in data.split(b"\n") if line.strip()]
    assert len(lines) == 4  # 3 + 3 + 3 + 1 tokens
    for seed in SEEDS:
        answer, _ = through_sagemaker(data, seed)
        assert answer.token_ids == 4 and len(answer.texts) == 4  # what counting lines or ids would claim
        tokens = loadtest.WordCounter()(answer.text)
        assert tokens == 10 and answer.text == generated(10)
        assert len(answer.itl(tokens)) == 9


@pytest.mark.parametrize("version", fake_lmi.VERSIONS)
@pytest.mark.parametrize("mode", ["dynamic", "rolling"])
def test_a_handler_error_before_the_answer_keeps_djls_message(version, mode):
    with FakeLmi(mode, version=version) as server:
        server.fail_next(1, error="CUDA out of memory")
        status, data = post(server, stream_payload("Hi", 4, True))
    assert status == 424
    message = error_body_message(data)
    assert "CUDA out of memory" in message
    if mode == "dynamic" or version == "0.23.0":  # Output.error, pretty-printed by outputs.py
        assert data.startswith(b"{\n  \"code\":424,")
        assert message.startswith("prediction failure" if version == "0.23.0" else "invoke handler failure")


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_chat_completions_stream_and_whole(version):
    with FakeLmi("rolling", version=version, merge=2, token_s=0.0005) as server:
        _status, streamed = post(server, chat_payload("Hi", 5, True))
        _status, whole = post(server, chat_payload("Hi", 5, False))
    for seed in SEEDS:
        answer, _ = through_sagemaker(streamed, seed)
        assert answer.streamed and answer.text == generated(5) and answer.error is None
    whole_answer = read_stream([(0.1, whole)])
    assert whole_answer.whole and whole_answer.text == generated(5) and whole_answer.reported_tokens == 5


def test_sagemaker_raises_model_stream_error_only_with_its_own_codes():
    data = b"".join(fake_lmi.vllm_line([fake_lmi.token(n)], [], False) for n in range(1, 5))
    for code in fake_lmi.SAGEMAKER_STREAM_ERRORS:
        with pytest.raises(EventStreamError, match="ModelStreamError"):
            list(sagemaker_chunks(botocore_events(data, 1, code)))
    with pytest.raises(ValueError, match="ModelInvocationTimeExceeded or StreamBroken"):
        fake_lmi.model_stream_error("ModelError")


def test_payload_forms():
    assert stream_payload("hi", 7, False) == {"inputs": "hi", "parameters": {"max_new_tokens": 7}}
    assert stream_payload("hi", 7, True)["stream"] is True
    assert chat_payload("hi", 7, True) == {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7,
                                           "stream": True}


# --- the load test over these answers -------------------------------------------------------------------------

def test_streamed_http_run_counts_tokens_not_lines_under_merging(tmp_path, capsys):
    with FakeLmi("rolling", version="0.36.0-lmi27", merge=2, max_rolling=8, prefill_s=0.02, token_s=0.004) as server:
        status = loadtest.main(["--url", server.url, "--stream", "--shape", "8x12", "--concurrency", "1,4",
                                "--requests", "8", "--warmup", "1", "--out", str(tmp_path), "--no-progress"])
        batches = list(server.batches)
        payloads = list(server.payloads)
    assert status == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stream"] is True and report["unit"] == "tokens" and report["output_lower_bound"]
    assert report["token_counter"] == "whitespace words" and "never one per streamed line" in report["token_count_rule"]
    assert report["token_methods"] == {"words": 16}  # words (12) beat ids (6 lines): the larger lower bound
    for step in report["steps"]:
        assert step["ok"] == 8 and step["streamed_requests"] == 8
        assert step["output_total"] == 8 * 12  # 6 lines per answer, 12 tokens
        assert 0.02 <= step["ttft_s"]["p50"] < step["latency_s"]["p50"]
        assert step["itl_s"]["p50"] < step["ttft_s"]["p50"]
    assert max(batches) > 1
    assert all(p["stream"] is True and p["parameters"]["max_new_tokens"] == 12 for p in payloads)
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert rows[0]["ttft_p90_s"] and rows[0]["itl_p99_s"] and rows[1]["client_output_per_s_p50"]
    table = capsys.readouterr().out
    assert "ttft p50 s" in table and "itl p90 ms" in table


@pytest.mark.parametrize("version", fake_lmi.VERSIONS)
def test_dynamic_batching_answers_whole_and_the_report_says_so(version, capsys):
    with FakeLmi("dynamic", version=version, batch_size=4, max_batch_delay_s=0.05, token_s=0.001) as server:
        status = loadtest.main(["--url", server.url, "--stream", "--shape", "8x6", "--concurrency", "4",
                                "--requests", "8", "--warmup", "0", "--no-progress"])
        batches = list(server.batches)
    assert status == 0 and max(batches) > 1
    table = capsys.readouterr().out
    assert "8 successful answers came whole, not as a token stream" in table


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_failures_before_and_after_the_200_are_server_errors_with_djls_message(version):
    with FakeLmi("rolling", version=version, token_s=0.002) as server:
        server.fail_next(1, error="bad input")
        target = loadtest.HttpTarget(server.url, timeout=10, stream=True)
        workload = loadtest.llm_workload(8, 5, loadtest.WordCounter(), stream=True)
        step = loadtest.run_step(target, workload, concurrency=1, requests=2, warmup=0)
        server.fail_streams(1, after=2)
        after = loadtest.run_step(target, workload, concurrency=1, requests=2, warmup=0)
    assert step["errors"]["4xx"] == 1 and step["error_examples"]["4xx"] == "HTTP 424: bad input"
    assert after["errors"]["5xx"] == 1 and after["ok"] == 1
    assert after["error_examples"]["5xx"] == "error in the answer: Inference Engine Failure (code 500)"


def test_sagemaker_response_stream_through_botocores_own_event_stream_parser(fake_aws):
    calls: list = []
    with FakeLmi("rolling", version="0.33.0", merge=3, prefill_s=0.01, token_s=0.003) as server:
        client = sagemaker_runtime(server, calls=calls, seed=7, stream_errors=[None, "StreamBroken"])
        target = loadtest.SageMakerTarget("llm", client=client, stream=True)
        workload = loadtest.llm_workload(8, 10, loadtest.WordCounter(), stream=True)
        server.fail_next(1)
        server.fail_streams(1, after=4)
        step = loadtest.run_step(target, workload, concurrency=1, requests=6, warmup=0)
    # 424 from the handler (ModelError), DJL's record after the 200, then SageMaker's StreamBroken.
    assert step["ok"] == 3 and step["errors"]["4xx"] == 1 and step["errors"]["5xx"] == 2
    assert step["streamed_requests"] == 3
    assert step["output_total"] == 30 and step["ttft_s"]["p50"] > 0.01
    assert {kind for kind, *_ in calls} == {"stream"}
    accepts = {headers.get("X-Amzn-SageMaker-Accept") for _, _, headers, _ in calls}
    assert accepts == {b"application/jsonlines"}, accepts
    assert step["error_examples"]["4xx"].startswith("ModelError: Received server error (424)")
    assert step["error_examples"]["5xx"] == "error in the answer: Inference Engine Failure (code 500)"


def test_chat_form_through_the_load_test(fake_aws):
    with FakeLmi("rolling", version="0.36.0-lmi27", merge=2, token_s=0.001) as server:
        target = loadtest.SageMakerTarget("llm", client=sagemaker_runtime(server, seed=3), stream=True)
        workload = loadtest.llm_workload(8, 6, loadtest.WordCounter(), stream=True, chat=True)
        step = loadtest.run_step(target, workload, concurrency=2, requests=4, warmup=0)
        payloads = list(server.payloads)
    assert step["ok"] == 4 and step["output_total"] == 24 and step["streamed_requests"] == 4
    assert all(p["messages"][0]["role"] == "user" and p["max_tokens"] == 6 and p["stream"] for p in payloads)


def test_stubbed_response_stream_call_has_the_api_s_parameters_and_model_errors_are_classified(fake_aws):
    client = boto3.client("sagemaker-runtime", region_name="us-west-2")
    with Stubber(client) as stubber:
        stubber.add_client_error("invoke_endpoint_with_response_stream", service_error_code="ModelError",
                                 service_message="Received client error (400) from primary", http_status_code=424,
                                 modeled_fields={"OriginalStatusCode": 400},
                                 expected_params={"EndpointName": "falcon", "Body": ANY,
                                                  "ContentType": "application/json",
                                                  "Accept": "application/jsonlines"})
        outcome = loadtest.SageMakerTarget("falcon", client=client, stream=True).invoke(b"{}")
    assert outcome.error == "4xx" and "ModelError" in outcome.detail


def test_a_plain_request_answered_in_chunks_by_lmi_dist_is_read_whole():
    """LMI 0.23 rolling answers every request in chunks; jsonlines lines read at once give the same text."""
    workload = loadtest.llm_workload(4, 3, loadtest.WordCounter())
    sample = loadtest.Sample(0.1)
    texts, answer = workload.read(workload.payloads[0], [(0.1, b'{"outputs": [" a"]}\n{"outputs": [" b c"]}\n')],
                                  sample)
    assert sample.error is None and texts == [" a b c"] and answer is not None


# --- exact token counts: LMI's details under merged deltas (issue 34) -----------------------------------------

def test_merged_deltas_with_details_are_counted_exactly_where_ids_and_words_fall_short():
    """Lines shaped as DJL's vLLM formatter writes them: 5 tokens in 2 merged lines, 3 whitespace words."""
    tokens = [(7, " 東"), (8, "京"), (9, " is"), (10, " big"), (11, "!")]
    history: list[str] = []
    plain = fake_lmi.vllm_line(tokens[:3], history, False) + fake_lmi.vllm_line(tokens[3:], history, True)
    history = []
    detailed = fake_lmi.vllm_line(tokens[:3], history, False) + \
        fake_lmi.vllm_line(tokens[3:], history, True, details=(5, 4))
    assert b'"generated_tokens": 6' in detailed  # DJL writes vLLM's running usage + 1
    for seed in SEEDS:
        answer, _ = through_sagemaker(detailed + fake_lmi.VLLM_STREAM_END, seed)
        assert token_count(answer, answer.text) == (5, "details") and answer.token_ids == 2
        bare, _ = through_sagemaker(plain + fake_lmi.VLLM_STREAM_END, seed)
        assert token_count(bare, bare.text) == (3, "words")  # 3 words > 2 ids: the larger lower bound
        assert token_count(bare, bare.text, lambda text: 5) == (5, "tokenizer")


def test_whole_answers_with_details_carry_vllms_own_count():
    tokens = [fake_lmi.token(n) for n in range(1, 4)]
    answer = read_stream([(0.1, fake_lmi.vllm_whole(generated(3), tokens))])
    assert token_count(answer, answer.text) == (3, "details")


@pytest.mark.parametrize(("lmi_version", "batching", "method"), [
    ("0.36.0-lmi27", "rolling_paged", "details"), ("0.33.0", "rolling_paged", "details"),
    (None, "rolling_paged", "words"), ("0.36.0-lmi27", "dynamic", "words")])
def test_a_run_with_merged_deltas_and_details_reports_exact_tokens_and_the_method(tmp_path, capsys, lmi_version,
                                                                                  batching, method):
    """The done-when of issue 34: the fake LMI merges 3 tokens a line and answers details as DJL does."""
    version = lmi_version or "0.36.0-lmi27"
    argv = ["--stream", "--shape", "8x10", "--concurrency", "2", "--requests", "6", "--warmup", "0",
            "--out", str(tmp_path), "--no-progress"]
    if lmi_version:
        argv += ["--lmi-version", lmi_version, "--batching", batching]
    with FakeLmi("rolling", version=version, merge=3, token_s=0.001) as server:
        status = loadtest.main(["--url", server.url, *argv])
        asked = [bool(p["parameters"].get("details")) for p in server.payloads]
    assert status == 0 and set(asked) == {method == "details"}
    report = json.loads((tmp_path / "report.json").read_text())
    step = report["steps"][0]
    assert step["output_total"] == 6 * 10 and step["token_methods"] == {method: 6}
    assert report["token_methods"] == {method: 6} and report["output_lower_bound"] is (method != "details")
    table = capsys.readouterr().out
    if method == "details":
        assert "tokens counted by LMI's details.generated_tokens for 6 answers" in table and "LOWER" not in table
    else:
        assert "whitespace words for 6 answers; a LOWER BOUND" in table
