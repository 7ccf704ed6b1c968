"""Generate text with the Falcon endpoint (boto3) or an LMI server (--url), printing tokens as they arrive.

    python -m inference.llm.generate --endpoint dev-falcon "What is Amazon SageMaker?"
    echo "Write a haiku about GPUs" | python -m inference.llm.generate --url http://127.0.0.1:8080 --max-new-tokens 64

Streams by default: `"stream": true` in the request, SageMaker's InvokeEndpointWithResponseStream for --endpoint
and a chunked HTTP response for --url (what LMI sends is described in `inference.llm.stream`). The text goes to
stdout as it arrives; time to first token, tokens and tokens/s go to stderr afterwards. An endpoint that answers
whole (dynamic batching streams nothing) is printed whole, with a note. `--no-stream` asks for a whole answer.
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

from inference.cli_types import positive, positive_int
from inference.endpoints import RequestFailed, invocations_url
from inference.endpoints import first_line as _first_line
from inference.endpoints import runtime_client as new_runtime_client
from inference.llm.loadtest_report import percentile
from inference.llm.stream import STREAM_ACCEPT, StreamFailed, TokenStream, http_chunks, sagemaker_chunks, stream_payload

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
            raise RequestFailed(f"{url}: HTTP {response.status}: {_first_line(response.read())}")
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
    except ClientError as error:
        details = error.response.get("Error", {})
        original = error.response.get("OriginalStatusCode")
        message = error.response.get("OriginalMessage") or details.get("Message") or str(error)
        status = f" (model answered {original})" if original else ""
        raise RequestFailed(f"{endpoint}: {details.get('Code', 'error')}{status}: {_first_line(message)}") from None
    except StreamFailed as error:
        raise RequestFailed(f"{endpoint}: {error}") from None
    except BotoCoreError as error:
        raise RequestFailed(f"{endpoint}: {error}") from None


def generate(chunks: Iterator[bytes], out: TextIO) -> tuple[TokenStream, float]:
    """Print tokens as they arrive; returns the stream read and the total seconds."""
    started = time.perf_counter()
    tokens = TokenStream()
    for chunk in chunks:
        for text in tokens.feed(time.perf_counter() - started, chunk):
            out.write(text)
            out.flush()
    elapsed = time.perf_counter() - started
    for text in tokens.finish(elapsed):
        out.write(text)
    return tokens, elapsed


def summary(tokens: TokenStream, elapsed: float) -> str:
    if not tokens.streamed:
        return f"answered whole after {elapsed:.2f} s (no token stream)"
    gaps = tokens.itl
    rate = len(tokens.texts) / elapsed if elapsed > 0 else 0.0
    median_gap = percentile(gaps, 50)
    gap = f", median gap between tokens {1000 * median_gap:.0f} ms" if median_gap is not None else ""
    return (f"time to first token {tokens.ttft:.2f} s, {len(tokens.texts)} tokens in {elapsed:.2f} s, "
            f"{rate:.1f} tokens/s{gap}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--endpoint", help="SageMaker endpoint name, invoked with boto3")
    target.add_argument("--url", help="an LMI server, e.g. http://127.0.0.1:8080 (/invocations is added)")
    parser.add_argument("--region", help="AWS region of the endpoint (default: the boto3 configuration)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128,
                        help="always sent, LMI's own default is 30 (default: 128)")
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
    stream = not args.no_stream
    body = json.dumps(stream_payload(prompt, args.max_new_tokens, stream)).encode()
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
        tokens, elapsed = generate(chunks, out)
        if not tokens.streamed:
            out.write(tokens.final_text or "")
        out.write("\n")
        out.flush()
    except RequestFailed as error:
        out.write("\n")
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    if tokens.error:
        print(f"{PROG}: error: the server failed during generation: {tokens.error}", file=sys.stderr)
        return 1
    print(summary(tokens, elapsed), file=sys.stderr)
    if stream and not tokens.streamed:
        print("note: the endpoint answered whole: LMI streams with rolling batch only (inference.llm.stream)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
