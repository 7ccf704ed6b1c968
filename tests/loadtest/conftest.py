"""Loopback servers for the load-test tests: the sentiment handler, a tiny causal LM, a scriptable fake.

All of them listen on 127.0.0.1 on a free port and run in threads of the test process. Models are random-weight
and tiny, built once per session from the repository's sample text, so nothing touches the network.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SAMPLE = Path(__file__).resolve().parents[2] / "training" / "data" / "sample" / "train.jsonl"


class LoopbackServer(ThreadingHTTPServer):
    """Answers POSTs with `respond(number, payload) -> (status, body dict, delay s)`; records every payload."""

    daemon_threads = True

    def __init__(self, respond: Callable[[int, dict], tuple[int, object, float]]):
        self.respond = respond
        self.payloads: list[dict] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/invocations"

    def reset(self, respond=None) -> None:
        with self.lock:
            self.payloads.clear()
        if respond is not None:
            self.respond = respond


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else headers and body as two writes wait ~40 ms for a delayed ACK
    server: LoopbackServer

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        with self.server.lock:
            self.server.payloads.append(payload)
            number = len(self.server.payloads)  # 1-based, in arrival order
        status, answer, delay = self.server.respond(number, payload)
        if delay:
            time.sleep(delay)
        if status is None:  # drop the connection without answering
            self.close_connection = True
            return
        data = (json.dumps(answer) + "\n").encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client gave up (timeout) and closed its end

    def log_message(self, format, *args):
        pass


def start(server):
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


def stop(server, thread):
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture(scope="session")
def sample_texts() -> list[str]:
    return [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def tokenizer_dir(sample_texts, tmp_path_factory) -> Path:
    """The tiny byte-level BPE tokenizer of training.tiny, saved so `--tokenizer DIR` can load it."""
    from training import tiny

    directory = tmp_path_factory.mktemp("tiny-tokenizer")
    tiny.build_tokenizer(sample_texts).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread while a module's model servers run (on two cores, spinning threads slow tiny
    models tenfold); restored afterwards so other test modules see the process as they expect."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def sentiment_server(sample_texts, tmp_path_factory, one_torch_thread):
    """The sentiment contract on a loopback server: a random-weight tiny RoBERTa classifier answered in process by
    the handler our server runs (`inference.sentiment.inference`: its decoding, limits, statuses and JSON), on an
    ephemeral port. What the load test is checked against; our server itself is tested in tests/inference."""
    from inference.sentiment import inference as handler
    from training import tiny

    tokenizer = tiny.build_tokenizer(sample_texts)
    model_dir = tmp_path_factory.mktemp("tiny-sentiment")
    tiny.build_model(tokenizer, max_length=128).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # model_fn sets torch's threads from it when it loads
        model = handler.model_fn(str(model_dir))
    lock = threading.Lock()  # one forward pass at a time, as one model replica runs them

    def respond(_number: int, payload) -> tuple[int, object, float]:
        try:
            request = handler.input_fn(json.dumps(payload).encode(), handler.JSON)
            with lock:
                prediction = handler.predict_fn(request, model)
            return 200, json.loads(handler.output_fn(prediction, handler.JSON)[0]), 0
        except handler.ClientError as error:
            return error.status_code, json.loads(error.message), 0

    server = LoopbackServer(respond)
    thread = start(server)
    yield server
    stop(server, thread)


class TinyCausalLM:
    """A random-weight 2-layer GPT-2 over the tiny tokenizer that generates exactly max_new_tokens tokens.

    The answer is LMI's `{"generated_text": ...}` with the new tokens joined by spaces, so a whitespace count
    of the text equals the number of tokens generated.
    """

    def __init__(self, tokenizer_dir: Path):
        import torch
        from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        config = GPT2Config(vocab_size=len(self.tokenizer), n_positions=512, n_embd=32, n_layer=2, n_head=2,
                            bos_token_id=self.tokenizer.bos_token_id, eos_token_id=self.tokenizer.eos_token_id,
                            pad_token_id=self.tokenizer.pad_token_id)
        torch.manual_seed(0)
        self.model = GPT2LMHeadModel(config).eval()
        self.lock = threading.Lock()  # generate() is not meant to be called from several threads at once

    def respond(self, _number: int, payload: dict) -> tuple[int, object, float]:
        parameters = (payload or {}).get("parameters") or {}
        new_tokens = parameters.get("max_new_tokens")
        if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), str) or not new_tokens:
            return 400, {"error": "send inputs and parameters.max_new_tokens"}, 0
        encoded = self.tokenizer(payload["inputs"], add_special_tokens=False, truncation=True, max_length=256,
                                 return_tensors="pt")
        with self.lock, self.torch.inference_mode():
            output = self.model.generate(**encoded, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                         do_sample=False)
        generated = output[0, encoded["input_ids"].shape[1]:].tolist()
        if len(generated) != new_tokens:
            return 500, {"error": f"generated {len(generated)} tokens, not {new_tokens}"}, 0
        words = ["".join(token.split()) or "_" for token in self.tokenizer.convert_ids_to_tokens(generated)]
        return 200, {"generated_text": " ".join(words)}, 0


@pytest.fixture(scope="module")
def llm_server(tokenizer_dir, one_torch_thread):
    """The tiny causal LM behind LMI's request format, on an ephemeral loopback port."""
    server = LoopbackServer(TinyCausalLM(tokenizer_dir).respond)
    thread = start(server)
    yield server
    stop(server, thread)


@pytest.fixture(scope="session")
def _fake_server():
    server = LoopbackServer(lambda _n, _p: (200, {"generated_text": "ok"}, 0))
    thread = start(server)
    yield server
    stop(server, thread)


@pytest.fixture
def fake_server(_fake_server):
    """A scriptable server without a model: set `fake_server.respond`; its request log starts empty."""
    _fake_server.reset()
    yield _fake_server
    _fake_server.reset(lambda _n, _p: (200, {"generated_text": "ok"}, 0))
