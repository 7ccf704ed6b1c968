"""What both endpoint clients share (sentiment `predict`, LLM `generate` and `loadtest`): errors, URLs, boto3."""

from __future__ import annotations

import urllib.parse


class RequestFailed(RuntimeError):
    """The endpoint or server could not answer; the message is one line for stderr."""


def first_line(body: bytes | str) -> str:
    """Error bodies from the container end with a traceback after the JSON line; keep the line."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    return (text.strip().splitlines() or [""])[0][:500]


def invocations_url(url: str) -> str:
    """`http://host:8080` -> `http://host:8080/invocations`; a URL with a path is used as given."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--url {url}: expected http://host:port")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/invocations")
    return urllib.parse.urlunsplit(parts)


def runtime_client(region: str | None):
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        return boto3.client("sagemaker-runtime", region_name=region)
    except (BotoCoreError, ValueError) as error:  # no region configured, or an empty AWS_REGION
        raise RequestFailed(f"{error}; pass --region or set AWS_REGION") from None
