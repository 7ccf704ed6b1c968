"""One-off generation streams to the terminal from the fake LMI, over HTTP and through SageMaker's event stream."""

from __future__ import annotations

import io
import json

import pytest

from inference.llm import generate
from tests.fake_lmi import FakeLmi, sagemaker_runtime


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


def test_tokens_reach_the_terminal_as_they_arrive_over_http(capsys):
    terminal = Terminal()
    with FakeLmi("rolling", prefill_s=0.01, token_s=0.002) as server:
        status = generate.main(["--url", server.url.removesuffix("/invocations"), "--max-new-tokens", "5",
                                "Tell", "me"], out=terminal)
        payload = server.payloads[0]
    assert status == 0 and terminal.getvalue() == " w1 w2 w3 w4 w5\n"
    assert terminal.flushes[:2] == [" w1", " w1 w2"]
    assert payload == {"inputs": "Tell me", "parameters": {"max_new_tokens": 5}, "stream": True}
    assert "time to first token" in capsys.readouterr().err


def test_the_endpoint_streams_through_invoke_endpoint_with_response_stream(fake_aws, capsys):
    terminal, calls = Terminal(), []
    with FakeLmi("rolling", token_s=0.002) as server:
        status = generate.main(["--endpoint", "dev-falcon", "--max-new-tokens", "3", "hello"],
                               runtime_client=sagemaker_runtime(server, calls=calls), out=terminal)
    assert status == 0 and terminal.getvalue() == " w1 w2 w3\n" and calls[0][0] == "stream"
    assert "3 tokens in" in capsys.readouterr().err


def test_a_whole_answer_is_printed_with_a_note(fake_aws, capsys):
    terminal = Terminal()
    with FakeLmi("dynamic", token_s=0.001) as server:
        status = generate.main(["--url", server.url, "--max-new-tokens", "2", "hi"], out=terminal)
        plain = generate.main(["--endpoint", "e", "--no-stream", "--max-new-tokens", "2", "hi"],
                              runtime_client=sagemaker_runtime(server), out=io.StringIO())
        assert json.dumps(server.payloads[-1]).find("stream") == -1
    err = capsys.readouterr().err
    assert status == 0 and plain == 0 and terminal.getvalue() == " w1 w2\n"
    assert "answered whole" in err and "rolling batch only" in err


def test_failures_exit_1_with_the_reason(fake_aws, capsys):
    with FakeLmi("rolling", token_s=0.002) as server:
        server.fail_next(1, status=503, message="overloaded")
        assert generate.main(["--url", server.url, "x"], out=io.StringIO()) == 1
        assert "HTTP 503" in capsys.readouterr().err
        server.fail_streams(1)
        terminal = io.StringIO()
        assert generate.main(["--endpoint", "e", "x"], runtime_client=sagemaker_runtime(server), out=terminal) == 1
        assert terminal.getvalue().startswith(" w1") and "ModelStreamError" in capsys.readouterr().err
        server.fail_streams(1)
        assert generate.main(["--url", server.url, "x"], out=io.StringIO()) == 1
        assert "failed during generation: engine failed" in capsys.readouterr().err
    assert generate.main(["--url", "http://127.0.0.1:9/invocations", "--timeout", "2", "x"], out=io.StringIO()) == 1
    assert generate.main(["--url", "ftp://nowhere", "x"], out=io.StringIO()) == 2
