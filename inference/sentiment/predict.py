"""Classify texts with the deployed endpoint (boto3) or a local server (--url); print the labels.

    python -m inference.sentiment.predict --endpoint sentiment-prod "Covid cases are increasing fast!"
    echo "what a game" | python -m inference.sentiment.predict --url http://127.0.0.1:8080 --top-k 3

Prints `label<TAB>score<TAB>text`, one line per text (top_k lines per text with --top-k, best first).

An overloaded server answers 429 (and an older one, or a stopping one, 503): the request is sent again, up to
`--retries` times, after the server's hint (`retry_after_s` in the JSON body) or 1, 2, 4 ... seconds, whichever is
longer. Through SageMaker the status to read is the container's own: InvokeEndpoint turns any container 4xx/5xx
into ModelError (HTTP 424) with `OriginalStatusCode` and `OriginalMessage` (the body), and drops the container's
headers (botocore's sagemaker-runtime model, `ModelError`; SageMaker's hosting documentation).
Exit status: 0 done, 1 the request failed (the reason on stderr), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from common.cli_types import non_negative_int, positive_int
from inference.endpoints import RequestFailed, invocations_url
from inference.endpoints import first_line as _first_line
from inference.endpoints import runtime_client as new_runtime_client

PROG = "python -m inference.sentiment.predict"
JSON = "application/json"
# Statuses that say "not now": our server's overload (429), an older server's or a stopping one's 503.
RETRY_STATUSES = (429, 503)
DEFAULT_RETRIES = 3
BACKOFF_S, BACKOFF_CAP_S = 1.0, 20.0


class Retryable(RequestFailed):
    """The server (or, through SageMaker, the container) answered a status worth retrying."""

    def __init__(self, message: str, status: int, hint_s: float | None):
        super().__init__(message)
        self.status, self.hint_s = status, hint_s


def retry_hint(body: bytes | str | None) -> float | None:
    """`retry_after_s` from the error body's first line (our server's 429), if there is one."""
    try:
        value = json.loads(_first_line(body or b"")).get("retry_after_s")
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def with_retries(call, retries: int, sleep=time.sleep):
    """`call()`, sent again after a retryable answer: the server's hint or the backoff, whichever is longer."""
    for attempt in range(retries + 1):
        try:
            return call()
        except Retryable as error:
            if attempt == retries:
                raise
            delay = min(max(error.hint_s or 0.0, BACKOFF_S * 2 ** attempt), BACKOFF_CAP_S)
            print(f"{PROG}: answered {error.status}; retrying in {delay:g} s ({attempt + 1} of {retries})",
                  file=sys.stderr, flush=True)
            sleep(delay)
    raise AssertionError("unreachable")


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
        failure = f"{endpoint}: {details.get('Code', 'error')}{status}: {_first_line(message)}"
        if details.get("Code") == "ModelError" and original in RETRY_STATUSES:
            raise Retryable(failure, original, retry_hint(error.response.get("OriginalMessage"))) from None
        raise RequestFailed(failure) from None
    except BotoCoreError as error:
        raise RequestFailed(f"{endpoint}: {error}") from None
    return response["Body"].read()


def invoke_url(url: str, payload: bytes, timeout: float) -> bytes:
    """Body of a POST to a server with the container contract (`make serve-local`, or a local container)."""
    request = urllib.request.Request(
        url, data=payload, method="POST", headers={"Content-Type": JSON, "Accept": JSON}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        body = error.read()
        failure = f"{url}: HTTP {error.code}: {_first_line(body)}"
        if error.code in RETRY_STATUSES:
            header = (error.headers.get("Retry-After") or "").strip() if error.headers else ""
            hint = retry_hint(body) if retry_hint(body) is not None else float(header) if header.isdigit() else None
            raise Retryable(failure, error.code, hint) from None
        raise RequestFailed(failure) from None
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
    parser.add_argument("--retries", type=non_negative_int, default=DEFAULT_RETRIES,
                        help="send again this many times after 429 or 503 (through SageMaker: ModelError with that "
                             "OriginalStatusCode)")
    parser.add_argument("--json", action="store_true", help="print the raw JSON response instead")
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to classify (default: lines of stdin)")
    return parser


def main(argv: list[str] | None = None, runtime_client=None, sleep=time.sleep) -> int:
    """`runtime_client`: a ready `sagemaker-runtime` client (tests pass a stubbed one); `sleep`: between retries."""
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
            body = with_retries(lambda: invoke_url(url, payload, args.timeout), args.retries, sleep)
        else:
            client = runtime_client or new_runtime_client(args.region)
            body = with_retries(lambda: invoke_endpoint(client, args.endpoint, payload), args.retries, sleep)
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
