"""The tool on loopback: the tiny causal LM, the sentiment server with the tiny model, and injected errors."""

from __future__ import annotations

import csv
import io
import json
import socket
import sys
import threading

import pytest

from inference.llm import loadtest

pytestmark = pytest.mark.servers  # runs the load test against local HTTP servers: make test's servers lane


def run(argv, tmp_path):
    """main() in-process with a report folder; returns (exit status, report.json as a dict)."""
    out = tmp_path / "out"
    status = loadtest.main([*argv, "--out", str(out), "--no-progress"])
    return status, json.loads((out / "report.json").read_text())


def test_llm_run_counts_requests_and_generated_tokens(llm_server, tmp_path, capsys):
    llm_server.reset()
    status, report = run(["--url", llm_server.url, "--kind", "llm", "--input-tokens", "12", "--output-tokens", "6",
                          "--concurrency", "1,2", "--requests", "6", "--warmup", "1"], tmp_path)
    assert status == 0 and report["passed"]
    assert [step["concurrency"] for step in report["steps"]] == [1, 2]
    for step in report["steps"]:
        assert step["requests"] == step["ok"] == 6 and step["error_count"] == 0
        assert step["output_total"] == 6 * 6  # every answer holds exactly max_new_tokens words
        assert step["warmup_requests"] == step["concurrency"]
        assert step["latency_s"]["p90"] > 0 and step["ttfb_s"]["p50"] > 0
    assert report["token_counter"] == "whitespace words" and report["unit"] == "tokens"
    assert report["token_methods"] == {"words": 12} and report["output_lower_bound"] is True
    assert report["shape"]["input_tokens"] == 12 and report["shape"]["prompt_lengths"] == [12]
    # The server saw warm-up plus measured requests, every one carrying max_new_tokens.
    assert len(llm_server.payloads) == (1 + 6) + (2 + 6)
    assert {payload["parameters"]["max_new_tokens"] for payload in llm_server.payloads} == {6}
    assert {len(payload["inputs"].split()) for payload in llm_server.payloads} == {12}
    table = capsys.readouterr().out
    assert "tok/s" in table and "whitespace words for 12 answers; a LOWER BOUND" in table
    assert (tmp_path / "out" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((tmp_path / "out" / "report.csv").open()))
    assert [row["output_total"] for row in rows] == ["36", "36"]


@pytest.mark.parametrize(("shape", "expected"), [("32x128", (32, 128)), ("256x32", (256, 32))])
def test_recipe_shapes_set_prompt_length_and_max_new_tokens(fake_server, tmp_path, shape, expected):
    status, report = run(["--url", fake_server.url, "--shape", shape, "--requests", "2", "--warmup", "0"], tmp_path)
    assert status == 0
    assert report["shape"]["input_tokens"] == expected[0] and report["shape"]["output_tokens"] == expected[1]
    assert {payload["parameters"]["max_new_tokens"] for payload in fake_server.payloads} == {expected[1]}
    assert {len(payload["inputs"].split()) for payload in fake_server.payloads} == {expected[0]}


def test_max_new_tokens_is_sent_by_default(fake_server, tmp_path):
    status, report = run(["--url", fake_server.url, "--requests", "1", "--warmup", "0"], tmp_path)
    assert report["shape"]["output_tokens"] == 128
    assert status == 0 and fake_server.payloads[0]["parameters"] == {"max_new_tokens": 128}


def test_tokenizer_counts_tokens_and_says_so(fake_server, tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    text = "So grateful for my family and friends, the weather is lovely today."
    fake_server.respond = lambda _n, _p: (200, [{"generated_text": text}], 0)  # LMI's list form
    status, report = run(["--url", fake_server.url, "--tokenizer", str(tokenizer_dir), "--input-tokens", "20",
                          "--output-tokens", "16", "--requests", "4", "--warmup", "0"], tmp_path)
    tokens = len(AutoTokenizer.from_pretrained(tokenizer_dir)(text, add_special_tokens=False)["input_ids"])
    assert tokens != len(text.split())  # so the check below tells the two counters apart
    assert status == 0 and report["steps"][0]["output_total"] == 4 * tokens
    assert report["token_counter"] == f"tokenizer {tokenizer_dir}" and report["unit"] == "tokens"
    assert report["token_methods"] == {"tokenizer": 4} and report["output_lower_bound"] is False
    assert all(abs(length - 20) <= 2 for length in report["shape"]["prompt_lengths"])


def test_echoed_prompt_is_not_counted_as_output(fake_server, tmp_path):
    fake_server.respond = lambda _n, payload: (200, {"generated_text": payload["inputs"] + " one two three"}, 0)
    status, report = run(["--url", fake_server.url, "--requests", "3", "--warmup", "0"], tmp_path)
    assert status == 0 and report["steps"][0]["output_total"] == 9


def scripted(release: threading.Event):
    """Every 5th request 503, the 2nd 429, the 3rd held until the run is over (past any client timeout), the rest
    fine. The held answer waits for an event, not a clock, so a loaded machine cannot turn a fast answer into a
    timeout: the client's timeout (2 s) is far above a loopback answer's time and far below the hold."""
    def respond(number, _payload):
        if number % 5 == 0:
            return 503, {"error": "busy"}, 0
        if number == 2:
            return 429, {"error": "slow down"}, 0
        if number == 3:
            release.wait(timeout=60)
            return 200, {"generated_text": "late"}, 0
        return 200, {"generated_text": "a b c"}, 0

    return respond


@pytest.mark.parametrize(("limit", "expected_status"), [(None, 1), ("0.5", 0)])
def test_errors_are_counted_by_kind_and_decide_the_exit_status(fake_server, tmp_path, limit, expected_status):
    release = threading.Event()
    fake_server.respond = scripted(release)
    argv = ["--url", fake_server.url, "--requests", "20", "--concurrency", "2", "--warmup", "0", "--timeout", "2"]
    try:
        status, report = run(argv + (["--max-error-rate", limit] if limit else []), tmp_path)
    finally:
        release.set()
    step = report["steps"][0]
    assert step["requests"] == 20 and step["ok"] == 14
    assert step["errors"] == {"throttled": 1, "4xx": 0, "5xx": 4, "timeout": 1, "connection": 0, "other": 0}
    assert step["output_total"] == 14 * 3
    assert step["error_examples"]["5xx"].startswith("HTTP 503")
    assert status == expected_status and report["passed"] is (expected_status == 0)


def test_client_errors_dropped_connections_and_bad_bodies(fake_server, tmp_path):
    def respond(number, _payload):
        return {1: (None, None, 0), 2: (400, {"error": "bad"}, 0), 3: (200, {"unexpected": 1}, 0)}.get(
            number, (200, {"generated_text": "x"}, 0))

    fake_server.respond = respond
    status, report = run(["--url", fake_server.url, "--requests", "5", "--warmup", "0", "--max-error-rate", "0.7"],
                         tmp_path)
    step = report["steps"][0]
    assert step["errors"]["connection"] == 1 and step["errors"]["4xx"] == 1 and step["errors"]["other"] == 1
    assert step["ok"] == 2 and status == 0


def test_duration_bounds_a_step(fake_server, tmp_path):
    status, report = run(["--url", fake_server.url, "--duration", "0.3", "--concurrency", "2", "--warmup", "0"],
                         tmp_path)
    step = report["steps"][0]
    assert status == 0 and step["requests"] >= 1 and step["wall_s"] < 5
    assert report["duration_per_step_s"] == 0.3


def test_default_request_count_is_ten_per_client(fake_server, tmp_path):
    status, report = run(["--url", fake_server.url, "--concurrency", "1,3", "--warmup", "0"], tmp_path)
    assert status == 0 and report["requests_per_step"] == "10 per client"
    assert [step["requests"] for step in report["steps"]] == [10, 30]


def test_sentiment_server_with_the_tiny_model(sentiment_server, tmp_path, capsys):
    url = sentiment_server.url
    status, report = run(["--url", url, "--kind", "sentiment", "--batch-size", "4", "--concurrency", "1,2",
                          "--requests", "5"], tmp_path)
    assert status == 0
    for step in report["steps"]:
        assert step["requests"] == step["ok"] == 5 and step["error_count"] == 0
        assert step["output_total"] == 5 * 4  # one label per text
    assert report["unit"] == "labels" and report["token_counter"] == "labels returned"
    assert report["shape"] == {"batch_size": 4}
    assert "labels/s" in capsys.readouterr().out


def test_sentiment_server_client_errors_are_4xx(sentiment_server, tmp_path):
    # 65 texts is over the handler's MAX_BATCH of 64: a 413 for every request.
    status, report = run(["--url", sentiment_server.url, "--kind", "sentiment",
                          "--batch-size", "65", "--requests", "2", "--warmup", "0"], tmp_path)
    assert status == 1 and report["steps"][0]["errors"]["4xx"] == 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_url_is_one_line_and_status_3(tmp_path, capsys):
    status = loadtest.main(["--url", f"http://127.0.0.1:{free_port()}/invocations", "--out", str(tmp_path)])
    error = capsys.readouterr().err.strip()
    assert status == 3 and len(error.splitlines()) == 1 and "cannot connect to 127.0.0.1" in error
    assert not (tmp_path / "report.json").exists()


def test_a_target_that_fails_everything_stops_the_sweep(fake_server, tmp_path, capsys):
    fake_server.respond = lambda _n, _p: (404, {"error": "no such route"}, 0)
    status, report = run(["--url", fake_server.url, "--concurrency", "1,2,4", "--requests", "2"], tmp_path)
    assert status == 3 and len(report["steps"]) == 1 and report["aborted"]
    captured = capsys.readouterr()
    assert "HTTP 404" in captured.err and "first 4xx error: HTTP 404" in captured.out


def test_help_and_usage_errors(capsys):
    assert loadtest.main(["--help"]) == 0
    assert "--max-error-rate" in capsys.readouterr().out
    assert loadtest.main([]) == 2
    assert loadtest.main(["--url", "http://127.0.0.1:1/", "--concurrency", "0"]) == 2
    assert loadtest.main(["--url", "http://127.0.0.1:1/", "--requests", "3", "--duration", "1"]) == 2
    assert loadtest.main(["--url", "http://127.0.0.1:1/", "--kind", "sentiment", "--shape", "32x128"]) == 2
    assert loadtest.main(["--url", "ftp://example/", "--requests", "1"]) == 2
    assert loadtest.main(["--url", "http://127.0.0.1:1/", "--kind", "sentiment", "--tokenizer", "x"]) == 2
    assert loadtest.main(["--url", "http://127.0.0.1:1/", "--region", "us-west-2"]) == 2
    assert loadtest.main(["--compare", "a.json"]) == 2
    assert "--compare needs --out" in capsys.readouterr().err


class _Terminal(io.StringIO):
    """stderr as a terminal, so tqdm (disable=None: only on a terminal) draws its bar."""

    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_one_bar_per_step_on_a_terminal_and_none_without(fake_server, monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert loadtest.main(["--url", fake_server.url, "--requests", "3", "--concurrency", "1,2", "--warmup", "0"]) == 0
    drawn = sys.stderr.getvalue()
    assert "\r" in drawn and "1 client" in drawn and "2 clients" in drawn and "/3" in drawn and "req" in drawn
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert loadtest.main(["--url", fake_server.url, "--requests", "3", "--warmup", "0", "--no-progress"]) == 0
    assert "client" not in sys.stderr.getvalue() and "\r" not in sys.stderr.getvalue()
