"""Classify texts with the deployed endpoint (boto3) or a local server (--url); print the labels.

    python -m inference.sentiment.predict --endpoint sentiment-prod "Covid cases are increasing fast!"
    echo "what a game" | python -m inference.sentiment.predict --url http://127.0.0.1:8080 --top-k 3

Prints `label<TAB>score<TAB>text`, one line per text (top_k lines per text with --top-k, best first).
Exit status: 0 done, 1 the request failed (the reason on stderr), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request

from inference.cli_types import positive_int
from inference.endpoints import RequestFailed, invocations_url
from inference.endpoints import first_line as _first_line
from inference.endpoints import runtime_client as new_runtime_client

PROG = "python -m inference.sentiment.predict"
JSON = "application/json"


def build_payload(texts: list[str], top_k: int | None) -> bytes:
    payload: dict = {"inputs": texts}
    if top_k is not None:
        payload["parameters"] = {"top_k": top_k}
    return json.dumps(payload).encode()


def invoke_endpoint(client, endpoint: str, payload: bytes) -> bytes:
    """Body of a SageMaker runtime `invoke_endpoint` answer; model errors keep the container's message."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = client.invoke_endpoint(
            EndpointName=endpoint, ContentType=JSON, Accept=JSON, Body=payload
        )
    except ClientError as error:
        details = error.response.get("Error", {})
        original = error.response.get("OriginalStatusCode")
        message = error.response.get("OriginalMessage") or details.get("Message") or str(error)
        status = f" (model answered {original})" if original else ""
        raise RequestFailed(f"{endpoint}: {details.get('Code', 'error')}{status}: {_first_line(message)}") from None
    except BotoCoreError as error:
        raise RequestFailed(f"{endpoint}: {error}") from None
    return response["Body"].read()


def invoke_url(url: str, payload: bytes, timeout: float) -> bytes:
    """Body of a POST to a server with the container contract (`inference.sentiment.serve` or a local container)."""
    request = urllib.request.Request(
        url, data=payload, method="POST", headers={"Content-Type": JSON, "Accept": JSON}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        raise RequestFailed(f"{url}: HTTP {error.code}: {_first_line(error.read())}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise RequestFailed(f"{url}: {reason}") from None


def parse_results(body: bytes, texts: list[str], top_k: int | None) -> list[list[tuple[str, float]]]:
    """[(label, score), ...] per text, best first; anything not shaped like the handler's answer fails."""
    try:
        results = json.loads(body)
        if not isinstance(results, list) or len(results) != len(texts):
            raise ValueError(f"expected a list of {len(texts)} results")
        ranked = []
        for result in results:
            entries = result if isinstance(result, list) else [result]
            ranked.append([(str(entry["label"]), float(entry["score"])) for entry in entries])
        return ranked
    except (ValueError, KeyError, TypeError) as error:
        raise RequestFailed(f"unexpected response ({error}): {_first_line(body)}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Send texts to the sentiment endpoint (or a local server) and print label, score and text.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--endpoint", help="SageMaker endpoint name, invoked with boto3")
    target.add_argument("--url", help="a server with the container contract, e.g. http://127.0.0.1:8080")
    parser.add_argument("--region", help="AWS region of the endpoint (default: the boto3 configuration)")
    parser.add_argument("--top-k", type=positive_int, help="print the K best labels per text")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for --url")
    parser.add_argument("--json", action="store_true", help="print the raw JSON response instead")
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to classify (default: lines of stdin)")
    return parser


def main(argv: list[str] | None = None, runtime_client=None) -> int:
    """`runtime_client`: a ready `sagemaker-runtime` client (tests pass a stubbed one)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    texts = args.texts or ([line.rstrip("\n") for line in sys.stdin if line.strip()] if not sys.stdin.isatty() else [])
    if not texts:
        parser.error("no texts: give them as arguments or on stdin")
    payload = build_payload(texts, args.top_k)
    try:
        if args.url:
            try:
                url = invocations_url(args.url)
            except ValueError as error:
                parser.error(str(error))
            body = invoke_url(url, payload, args.timeout)
        else:
            client = runtime_client or new_runtime_client(args.region)
            body = invoke_endpoint(client, args.endpoint, payload)
        results = parse_results(body, texts, args.top_k)
    except RequestFailed as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(body.decode("utf-8", "replace"))
        return 0
    for text, ranked in zip(texts, results, strict=True):
        for label, score in ranked:
            print(f"{label}\t{score:.4f}\t{text}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
