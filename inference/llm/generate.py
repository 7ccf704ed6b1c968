"""Generate text with an LMI endpoint (boto3) or an LMI server (--url), printing the text as it arrives.

    python -m inference.llm.generate --endpoint dev-falcon "What is Amazon SageMaker?"
    echo "Write a haiku about GPUs" | python -m inference.llm.generate --url http://127.0.0.1:8080 --max-new-tokens 64
    python -m inference.llm.generate --endpoint dev-llm --chat --tokenizer ./tokenizer "Explain KV caching"

Streams by default: `"stream": true` in the request, SageMaker's InvokeEndpointWithResponseStream for --endpoint
and a chunked HTTP response for --url. `--chat` sends the OpenAI-compatible form (`messages`, `max_tokens`), which
LMI's vLLM service (0.33+) answers as Chat Completions. What LMI sends, and how it is read, is described in
`inference.llm.stream`. The text goes to stdout as it arrives; timings go to stderr afterwards. An answer that
comes whole (dynamic batching never streams) is printed whole, with no time to first token claimed.

Tokens are counted from what the server reports (details.generated_tokens, which LMI sends when the request asks
`"details": true`: asked where `--lmi-version` and `--batching` say the container answers it, 0.33+ vLLM; a chat
answer's usage.completion_tokens), else with `--tokenizer DIR`, else as the larger of token ids and whitespace
words, a lower bound (`inference.llm.stream` token_count). The summary names the method. Lines are never
counted, since vLLM merges tokens into one line when the reader falls behind.
Exit status: 0 done, 1 the request failed (the reason on stderr, after any text already printed), 2 usage error.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from collections.abc import Iterator
from typing import TextIO
from urllib.parse import urlsplit

from common.cli_types import positive, positive_int
from inference.endpoints import RequestFailed, invocations_url
from inference.endpoints import runtime_client as new_runtime_client
from inference.llm.stream import (
    STREAM_ACCEPT,
    StreamFailed,
    TokenStream,
    chat_payload,
    error_body_message,
    http_chunks,
    sagemaker_chunks,
    stream_payload,
    token_count,
)

PROG = "python -m inference.llm.generate"
JSON = "application/json"


def url_chunks(url: str, body: bytes, stream: bool, timeout: float) -> Iterator[bytes]:
    """The response body of a POST to `url`, chunk by chunk; RequestFailed for refusals and HTTP errors."""
    split = urlsplit(url)
    connection_class = http.client.HTTPSConnection if split.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(split.hostname, split.port, timeout=timeout)
    try:
        connection.request("POST", split.path or "/", body=body,
                           headers={"Content-Type": JSON, "Accept": STREAM_ACCEPT if stream else JSON})
        response = connection.getresponse()
        if response.status != 200:
            raise RequestFailed(f"{url}: HTTP {response.status}: {error_body_message(response.read())}")
        yield from http_chunks(response)
    except (OSError, http.client.HTTPException) as error:
        raise RequestFailed(f"{url}: {getattr(error, 'strerror', None) or error}") from None
    finally:
        connection.close()


def endpoint_chunks(client, endpoint: str, body: bytes, stream: bool) -> Iterator[bytes]:
    """The endpoint's answer chunk by chunk (PayloadPart events when streaming); errors as RequestFailed."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        if stream:
            response = client.invoke_endpoint_with_response_stream(EndpointName=endpoint, Body=body,
                                                                   ContentType=JSON, Accept=STREAM_ACCEPT)
            yield from sagemaker_chunks(response["Body"])
        else:
            response = client.invoke_endpoint(EndpointName=endpoint, Body=body, ContentType=JSON, Accept=JSON)
            yield response["Body"].read()
    except ClientError as error:  # a ModelError (the container's non-200), or SageMaker's own stream error
        details = error.response.get("Error", {})
        original = error.response.get("OriginalStatusCode")
        message = error.response.get("OriginalMessage") or details.get("Message") or str(error)
        code = details.get("Code", "error")  # ModelStreamError: SageMaker's (ModelInvocationTimeExceeded, ...)
        status = f" (model answered {original})" if original else ""
        raise RequestFailed(f"{endpoint}: {code}{status}: {error_body_message(message)}") from None
    except StreamFailed as error:
        raise RequestFailed(f"{endpoint}: {error}") from None
    except BotoCoreError as error:
        raise RequestFailed(f"{endpoint}: {error}") from None


def generate(chunks: Iterator[bytes], out: TextIO) -> tuple[TokenStream, float]:
    """Print text pieces as they arrive; returns the answer read and the total seconds."""
    started = time.perf_counter()
    answer = TokenStream()
    try:
        for chunk in chunks:
            for text in answer.feed(time.perf_counter() - started, chunk):
                out.write(text)
                out.flush()
    finally:
        elapsed = time.perf_counter() - started
        for text in answer.finish(elapsed):
            out.write(text)
    return answer, elapsed


METHODS = {"details": "as reported by the server: details.generated_tokens",
           "usage": "as reported by the server: usage.completion_tokens",
           "tokenizer": "counted with the tokenizer",
           "ids": "token ids: a lower bound, pass --lmi-version or --tokenizer DIR for the exact count",
           "words": "whitespace words: a lower bound, pass --lmi-version or --tokenizer DIR for the exact count"}


def count_tokens(answer: TokenStream, tokenizer=None) -> tuple[int, str]:
    """(tokens, how they were counted): the server's own count, else the tokenizer's, else a lower bound."""
    def by_tokenizer(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    tokens, method = token_count(answer, answer.text, by_tokenizer if tokenizer is not None else None)
    return tokens, METHODS[method]


def summary(answer: TokenStream, elapsed: float, tokenizer=None) -> str:
    tokens, method = count_tokens(answer, tokenizer)
    amount = f"{tokens} tokens ({method})"
    if not answer.streamed:
        return f"answered whole after {elapsed:.2f} s (no token stream, no time to first token): {amount}"
    rate = f", {tokens / elapsed:.1f} tokens/s" if tokens and elapsed > 0 else ""
    gaps = answer.itl(tokens or 0)
    gap = f", {1000 * gaps[0]:.0f} ms per token after the first" if gaps else ""
    return f"time to first token {answer.ttft:.2f} s, {amount} in {elapsed:.2f} s{rate}{gap}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--endpoint", help="SageMaker endpoint name, invoked with boto3")
    target.add_argument("--url", help="an LMI server, e.g. http://127.0.0.1:8080 (/invocations is added)")
    parser.add_argument("--region", help="AWS region of the endpoint (default: the boto3 configuration)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128,
                        help="always sent (max_tokens with --chat); LMI's own default is 30 (default: 128)")
    parser.add_argument("--chat", action="store_true",
                        help="send the OpenAI-compatible chat form (messages), answered by LMI's vLLM service")
    parser.add_argument("--tokenizer", metavar="DIR", help="count tokens with this Hugging Face tokenizer")
    parser.add_argument("--lmi-version", metavar="VERSION",
                        help="the endpoint's falcon.lmi_version: where it answers \"details\": true (0.33+ vLLM with "
                             "--batching rolling_paged) the request asks for LMI's own token count")
    parser.add_argument("--batching", default="rolling_paged", choices=("dynamic", "rolling", "rolling_paged"),
                        help="the endpoint's falcon.batching, with --lmi-version (default: rolling_paged)")
    parser.add_argument("--no-stream", action="store_true", help="ask for one whole answer instead of a stream")
    parser.add_argument("--timeout", type=positive(float), default=60.0,
                        help="seconds per read for --url (default: 60)")
    parser.add_argument("prompt", nargs="*", metavar="WORD", help="the prompt (default: stdin)")
    return parser


def main(argv: list[str] | None = None, runtime_client=None, out: TextIO | None = None) -> int:
    """`runtime_client`: a ready sagemaker-runtime client (tests pass a fake one)."""
    out = out or sys.stdout
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    prompt = " ".join(args.prompt) or ("" if sys.stdin.isatty() else sys.stdin.read().strip())
    if not prompt:
        print(f"{PROG}: error: no prompt: give it as arguments or on stdin", file=sys.stderr)
        return 2
    tokenizer = None
    if args.tokenizer:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        except (OSError, ValueError) as error:
            print(f"{PROG}: error: --tokenizer {args.tokenizer}: {error}".splitlines()[0], file=sys.stderr)
            return 2
    stream = not args.no_stream
    details = False
    if args.lmi_version:
        from inference.llm.lmi.requests import details_supported
        from inference.llm.lmi.versions import VERSIONS

        if args.lmi_version not in VERSIONS:
            print(f"{PROG}: error: --lmi-version {args.lmi_version}: one of {', '.join(VERSIONS)}", file=sys.stderr)
            return 2
        details = details_supported(args.lmi_version, args.batching) and not args.chat
    request = chat_payload(prompt, args.max_new_tokens, stream) if args.chat else \
        stream_payload(prompt, args.max_new_tokens, stream, details=details)
    body = json.dumps(request).encode()
    try:
        if args.url:
            try:
                url = invocations_url(args.url)
            except ValueError as error:
                print(f"{PROG}: error: {error}", file=sys.stderr)
                return 2
            chunks = url_chunks(url, body, stream, args.timeout)
        else:
            chunks = endpoint_chunks(runtime_client or new_runtime_client(args.region), args.endpoint, body, stream)
        answer, elapsed = generate(chunks, out)
        if not answer.streamed and answer.error is None:
            out.write(answer.final_text or "")
        out.write("\n")
        out.flush()
    except RequestFailed as error:
        out.write("\n")
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    if answer.error:
        print(f"{PROG}: error: the server failed during generation: {answer.error}", file=sys.stderr)
        return 1
    print(summary(answer, elapsed, tokenizer), file=sys.stderr)
    if stream and not answer.streamed:
        print("note: the endpoint answered whole: LMI streams with rolling batch only (inference.llm.stream)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
