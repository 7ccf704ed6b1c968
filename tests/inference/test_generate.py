"""One-off generation to the terminal from the fake LMI (bytes as DJL builds them, per version), over HTTP and
through SageMaker's event stream cut at random PayloadPart boundaries."""

from __future__ import annotations

import io

import pytest

from inference.llm import generate
from tests import fake_lmi
from tests.fake_lmi import FakeLmi, generated, sagemaker_runtime

VLLM_VERSIONS = ("0.33.0", "0.35.0", "0.36.0-lmi27")


@pytest.fixture
def fake_aws(monkeypatch, tmp_path):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-west-2", "AWS_EC2_METADATA_DISABLED": "true",
                        "AWS_CONFIG_FILE": str(tmp_path / "none"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
        monkeypatch.setenv(name, value)


class Terminal(io.StringIO):
    """Records what had been written at each flush, to show the text came out piece by piece."""

    def __init__(self):
        super().__init__()
        self.flushes: list[str] = []

    def flush(self):
        self.flushes.append(self.getvalue())


def test_text_reaches_the_terminal_as_it_arrives_over_http(capsys):
    terminal = Terminal()
    with FakeLmi("rolling", version="0.36.0-lmi27", prefill_s=0.01, token_s=0.002) as server:
        status = generate.main(["--url", server.url.removesuffix("/invocations"), "--max-new-tokens", "5",
                                "Tell", "me"], out=terminal)
        payload = server.payloads[0]
    assert status == 0 and terminal.getvalue() == generated(5) + "\n"
    assert terminal.flushes[:2] == [generated(1), generated(2)]
    assert payload == {"inputs": "Tell me", "parameters": {"max_new_tokens": 5}, "stream": True}
    err = capsys.readouterr().err
    assert "time to first token" in err and "5 tokens (whitespace words: a lower bound" in err


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_merged_lines_through_sagemaker_print_every_character(fake_aws, capsys, version):
    terminal, calls = Terminal(), []
    with FakeLmi("rolling", version=version, merge=3, token_s=0.002) as server:
        status = generate.main(["--endpoint", "dev-llm", "--max-new-tokens", "7", "hello"],
                               runtime_client=sagemaker_runtime(server, calls=calls, seed=5), out=terminal)
    assert status == 0 and terminal.getvalue() == generated(7) + "\n" and calls[0][0] == "stream"
    assert "7 tokens (whitespace words: a lower bound" in capsys.readouterr().err  # not 3 lines, not 3 token ids


@pytest.mark.parametrize(("version", "asked"), [("0.36.0-lmi27", True), ("0.33.0", True), ("0.23.0", False)])
def test_lmi_version_asks_for_details_where_lmi_answers_them(fake_aws, capsys, version, asked):
    """Issue 34: merged deltas through SageMaker, counted exactly from DJL's details (generated_tokens - 1, see
    inference.llm.stream), and the summary says so."""
    mode_version = version if asked else "0.36.0-lmi27"  # 0.23 is never asked; its requests go to any server
    with FakeLmi("rolling", version=mode_version, merge=3, token_s=0.001) as server:
        status = generate.main(["--endpoint", "e", "--lmi-version", version, "--max-new-tokens", "7", "hi"],
                               runtime_client=sagemaker_runtime(server, seed=2), out=Terminal())
        payload = server.payloads[0]
    assert status == 0 and ("details" in payload["parameters"]) is asked
    err = capsys.readouterr().err
    expected = "7 tokens (as reported by the server: details.generated_tokens)" if asked else \
        "7 tokens (whitespace words: a lower bound"
    assert expected in err


@pytest.mark.parametrize("version", fake_lmi.VERSIONS)
def test_dynamic_batching_asked_to_stream_is_printed_whole_without_ttft(fake_aws, capsys, version):
    terminal = Terminal()
    with FakeLmi("dynamic", version=version, token_s=0.001) as server:
        status = generate.main(["--endpoint", "e", "--max-new-tokens", "3", "hi"],
                               runtime_client=sagemaker_runtime(server, seed=2), out=terminal)
        plain = generate.main(["--url", server.url, "--no-stream", "--max-new-tokens", "2", "hi"], out=io.StringIO())
        assert "stream" not in server.payloads[-1]
    err = capsys.readouterr().err
    assert status == 0 and plain == 0 and terminal.getvalue() == "hi" + generated(3) + "\n"
    assert "answered whole" in err and "rolling batch only" in err and "time to first token 0" not in err


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_engine_failure_after_the_200_exits_1_with_djls_message(fake_aws, capsys, version):
    terminal = io.StringIO()
    with FakeLmi("rolling", version=version, token_s=0.002) as server:
        server.fail_streams(1, after=2)
        status = generate.main(["--endpoint", "e", "--max-new-tokens", "6", "x"],
                               runtime_client=sagemaker_runtime(server, seed=9), out=terminal)
    assert status == 1 and terminal.getvalue().startswith(generated(2))
    assert "failed during generation: Inference Engine Failure (code 500)" in capsys.readouterr().err


def test_chat_form_streams_chat_completion_chunks(fake_aws, capsys):
    terminal = Terminal()
    with FakeLmi("rolling", version="0.36.0-lmi27", merge=2, token_s=0.002) as server:
        status = generate.main(["--endpoint", "e", "--chat", "--max-new-tokens", "4", "hi"],
                               runtime_client=sagemaker_runtime(server, seed=4), out=terminal)
        whole = generate.main(["--url", server.url, "--chat", "--no-stream", "--max-new-tokens", "3", "hi"],
                              out=io.StringIO())
        payloads = list(server.payloads)
    assert status == 0 and whole == 0 and terminal.getvalue() == generated(4) + "\n"
    assert payloads[0] == {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    assert "3 tokens (as reported by the server: usage.completion_tokens)" in capsys.readouterr().err


def test_failures_exit_1_with_the_reason(fake_aws, capsys):
    with FakeLmi("dynamic", version="0.23.0", token_s=0.001) as server:
        server.fail_next(1, error="CUDA out of memory")
        assert generate.main(["--url", server.url, "x"], out=io.StringIO()) == 1
        assert "HTTP 424: prediction failure: CUDA out of memory" in capsys.readouterr().err
    with FakeLmi("rolling", version="0.36.0-lmi27", token_s=0.002) as server:
        runtime = sagemaker_runtime(server, stream_errors=["ModelInvocationTimeExceeded"])
        assert generate.main(["--endpoint", "e", "--max-new-tokens", "9", "x"], runtime_client=runtime,
                             out=io.StringIO()) == 1
        assert "ModelStreamError" in capsys.readouterr().err
    assert generate.main(["--url", "http://127.0.0.1:9/invocations", "--timeout", "2", "x"], out=io.StringIO()) == 1
    assert generate.main(["--url", "ftp://nowhere", "x"], out=io.StringIO()) == 2
