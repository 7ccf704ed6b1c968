"""Token streaming: LMI's JSON lines read from HTTP chunks and from SageMaker's event stream, and the figures
(time to first token, inter-token latency, per-client tokens/s) they give, against the loopback fake LMI."""

from __future__ import annotations

import csv
import json

import boto3
import pytest
from botocore.stub import ANY, Stubber

from inference.llm import loadtest
from inference.llm.stream import TokenStream, read_stream, sagemaker_chunks, stream_payload
from tests.fake_lmi import FakeLmi, sagemaker_runtime


@pytest.fixture
def fake_aws(monkeypatch, tmp_path):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-west-2",
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


# --- reading the formats DJL Serving sends -----------------------------------------------------------------

def test_jsonlines_split_anywhere_across_chunks_keeps_every_token_and_its_arrival():
    lines = b'{"token": {"id": 1, "text": " a", "log_prob": -1}}\n{"token": {"id": 2, "text": " b"}}\n' \
            b'{"token": {"id": 3, "text": " c"}, "generated_text": " a b c"}\n'
    stream = read_stream([(0.1, lines[:10]), (0.2, lines[10:60]), (0.5, lines[60:])])
    assert stream.texts == [" a", " b", " c"] and stream.final_text == " a b c" and stream.error is None
    assert stream.times == [0.2, 0.5, 0.5] and stream.ttft == 0.2
    assert stream.itl == pytest.approx([0.3, 0.0])


def test_server_sent_events_old_outputs_format_and_a_last_line_without_newline():
    sse = read_stream([(0.1, b'data: {"token": {"id": 1, "text": "x"}}\n\n'), (0.2, b'data: {"token": {"text": "y"}}')])
    assert sse.texts == ["x", "y"] and sse.times == [0.1, 0.2]
    old = read_stream([(0.3, b'{"outputs": [" one"]}\n{"outputs": [" two", " three"]}\n')])  # 0.23 jsonlines
    assert old.texts == [" one", " two", " three"]


def test_error_token_special_tokens_and_a_whole_json_answer():
    failed = read_stream([(0.1, b'{"token": {"text": " a"}}\n{"token": {"id": -1, "text": "", "error_msg": "OOM"},'
                                b' "details": {"finish_reason": "error"}}\n')])
    assert failed.error == "OOM"
    special = read_stream([(0.1, b'{"token": {"text": "</s>", "special_token": true}}\n')])
    assert special.texts == []
    whole = read_stream([(0.4, b'{"generated_text": "no stream here"}')])
    assert not whole.streamed and whole.ttft is None and whole.text == "no stream here"
    garbage = TokenStream()
    garbage.feed(0.1, b"<html>\n")
    assert garbage.error.startswith("not a JSON line")


def test_stream_payload_always_sends_max_new_tokens_and_stream_only_when_asked():
    assert stream_payload("hi", 7, False) == {"inputs": "hi", "parameters": {"max_new_tokens": 7}}
    assert stream_payload("hi", 7, True)["stream"] is True


def test_hand_made_stream_errors_become_stream_failed():
    from inference.llm.stream import StreamFailed

    chunks = sagemaker_chunks([{"PayloadPart": {"Bytes": b"a"}},
                               {"ModelStreamError": {"Message": "broken", "ErrorCode": "X"}}])
    assert next(chunks) == b"a"
    with pytest.raises(StreamFailed, match="ModelStreamError X: broken"):
        next(chunks)


# --- end to end against the fake LMI -----------------------------------------------------------------------

def test_streamed_http_run_reports_ttft_itl_and_exact_token_counts(tmp_path, capsys):
    with FakeLmi("rolling", max_rolling=8, prefill_s=0.02, token_s=0.004) as server:
        status = loadtest.main(["--url", server.url, "--stream", "--shape", "8x12", "--concurrency", "1,4",
                                "--requests", "8", "--warmup", "1", "--out", str(tmp_path), "--no-progress"])
        batches = list(server.batches)
        payloads = list(server.payloads)
    assert status == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stream"] is True and "one per token line" in report["token_counter"] and report["unit"] == "tokens"
    for step in report["steps"]:
        assert step["ok"] == 8 and step["streamed_requests"] == 8
        assert step["output_total"] == 8 * 12  # one per token line, not a guess from words
        # The first token waits for the prefill, later ones only for a decode step.
        assert 0.02 <= step["ttft_s"]["p50"] < step["latency_s"]["p50"]
        assert step["itl_s"]["p50"] < step["ttft_s"]["p50"]
        assert step["client_output_per_s"]["p50"] == pytest.approx(12 / step["latency_s"]["p50"], rel=0.3)
    assert max(batches) > 1  # four clients decoded together: continuous batching happened
    assert all(p["stream"] is True and p["parameters"]["max_new_tokens"] == 12 for p in payloads)
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert rows[0]["ttft_p90_s"] and rows[0]["itl_p99_s"] and rows[1]["client_output_per_s_p50"]
    assert (tmp_path / "report.png").stat().st_size > 0
    table = capsys.readouterr().out
    assert "ttft p50 s" in table and "itl p90 ms" in table and "tok/s/client" in table


def test_dynamic_batching_answers_whole_and_the_report_says_so(tmp_path, capsys):
    with FakeLmi("dynamic", batch_size=4, max_batch_delay_s=0.05, token_s=0.001) as server:
        status = loadtest.main(["--url", server.url, "--stream", "--shape", "8x6", "--concurrency", "4",
                                "--requests", "8", "--warmup", "0", "--no-progress"])
        batches = list(server.batches)
    assert status == 0 and max(batches) > 1
    table = capsys.readouterr().out
    assert "8 successful answers came whole, not as a token stream" in table


def test_failures_before_and_during_the_stream_are_counted_by_kind():
    with FakeLmi("rolling", token_s=0.002) as server:
        server.fail_next(1, status=503)
        server.fail_streams(1)
        target = loadtest.HttpTarget(server.url, timeout=10, stream=True)
        workload = loadtest.llm_workload(8, 5, loadtest.WordCounter(), stream=True)
        step = loadtest.run_step(target, workload, concurrency=1, requests=4, warmup=0)
    assert step["errors"]["5xx"] == 2 and step["ok"] == 2
    assert step["error_examples"]["5xx"].startswith("HTTP 503")


def test_sagemaker_response_stream_through_botocores_own_event_stream_parser(fake_aws):
    calls: list = []
    with FakeLmi("rolling", prefill_s=0.01, token_s=0.003) as server:
        client = sagemaker_runtime(server, calls=calls)
        target = loadtest.SageMakerTarget("falcon", client=client, stream=True)
        workload = loadtest.llm_workload(8, 10, loadtest.WordCounter(), stream=True)
        server.fail_next(1, status=503)
        server.fail_streams(1)
        step = loadtest.run_step(target, workload, concurrency=2, requests=6, warmup=0)
    assert step["ok"] == 4 and step["errors"]["5xx"] == 2 and step["streamed_requests"] == 4
    assert step["output_total"] == 40 and step["ttft_s"]["p50"] > 0.01
    assert {kind for kind, *_ in calls} == {"stream"}
    accepts = {headers.get("X-Amzn-SageMaker-Accept") for _, _, headers, _ in calls}
    assert accepts == {b"application/jsonlines"}, accepts
    assert all(body["stream"] is True and body["parameters"]["max_new_tokens"] == 10 for *_, body in calls)
    assert step["error_examples"]["5xx"].startswith("ModelError: Received server error (503)")


def test_a_failure_inside_the_sagemaker_stream_is_a_server_error(fake_aws):
    with FakeLmi("rolling", token_s=0.002) as server:
        target = loadtest.SageMakerTarget("falcon", client=sagemaker_runtime(server), stream=True)
        server.fail_streams(1)
        outcome = target.invoke(json.dumps(stream_payload("hello", 5, True)).encode())
    assert outcome.error == "5xx" and outcome.detail == "ModelStreamError: Model stream error: engine failed"


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


def test_a_whole_answer_in_json_lines_is_still_read():
    """LMI 0.23 with option.output_formatter=jsonlines answers plain requests in JSON lines too."""
    workload = loadtest.llm_workload(4, 3, loadtest.WordCounter())
    _output, texts, problem = workload.read(workload.payloads[0], b'{"outputs": [" a"]}\n{"outputs": [" b c"]}\n')
    assert problem is None and texts == [" a b c"]
