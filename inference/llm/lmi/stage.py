"""Stage a pinned revision of a Hugging Face model in S3, so the endpoint serves it from /opt/ml/model with network
isolation on: the recommended production path (docs/falcon-lmi.md, "Serving from S3").

    python -m inference.llm.lmi stage --model-id Qwen/Qwen3-8B --revision <40-hex commit> \\
        --s3-uri s3://<artifact-bucket>/models/qwen3-8b/ [--hf-token-secret prod/hf-token] [--region us-west-2]

It downloads the revision's config, tokenizer and safetensors files (no pickled *.bin, no remote code), uploads
them under <s3-uri><revision>/ with the bucket's default encryption, writes STAGED.json there (model, revision,
sha256 of each file) and prints the falcon.model_s3_uri to set. Run it where the hub is reachable (HF_HUB_OFFLINE
unset). A gated model's token comes from HF_TOKEN or --hf-token-secret (Secrets Manager); it is never printed.
Exit status: 0 staged, 1 failed (one `error:` line), 2 usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REVISION = re.compile(r"^[0-9a-f]{40}$")
S3_PREFIX = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(.+/)$")
# What LMI's vLLM and the tokenizer read; weights as safetensors only.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "tokenizer*"]
MANIFEST = "STAGED.json"

Downloader = Callable[..., str]  # huggingface_hub.snapshot_download's shape: returns the local folder


class StageError(Exception):
    """Staging cannot go on; the message is one line."""


def _snapshot_download(**kwargs) -> str:
    from huggingface_hub import snapshot_download  # only the operator's tool needs it

    return snapshot_download(**kwargs)


def hub_token(secret: str | None, region: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The token from Secrets Manager (secret given) or HF_TOKEN; None for public models."""
    if secret:
        import boto3

        try:
            return boto3.client("secretsmanager", region_name=region).get_secret_value(SecretId=secret)["SecretString"]
        except Exception as error:  # botocore's errors name the secret, never its value
            raise StageError(f"cannot read secret {secret}: {error}") from None
    return (environ if environ is not None else dict(os.environ)).get("HF_TOKEN") or None


def stage(model_id: str, revision: str, s3_uri: str, *, token: str | None, region: str | None = None,
          download: Downloader | None = None, s3_client=None, log=print) -> str:
    """Download, upload, write the manifest; returns the S3 prefix to set as falcon.model_s3_uri."""
    if not REVISION.match(revision):
        raise StageError(f"--revision {revision!r}: a full 40-character commit hash (a branch or tag can move)")
    match = S3_PREFIX.match(s3_uri)
    if not match:
        raise StageError(f"--s3-uri {s3_uri!r}: an s3://bucket/prefix/ ending in /")
    bucket, prefix = match.group(1), f"{match.group(2)}{revision}/"
    if s3_client is None:
        import boto3

        s3_client = boto3.client("s3", region_name=region)
    with tempfile.TemporaryDirectory(prefix="stage-") as folder:
        log(f"downloading {model_id}@{revision} ...")
        fetch = download or _snapshot_download
        local = Path(fetch(repo_id=model_id, revision=revision, local_dir=folder, allow_patterns=ALLOW_PATTERNS,
                           token=token))
        files = sorted(p for p in local.rglob("*") if p.is_file() and ".cache" not in p.relative_to(local).parts)
        names = [p.relative_to(local).as_posix() for p in files]
        if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
            raise StageError(f"{model_id}@{revision} has no config.json and *.safetensors weights to serve")
        digests = {}
        for number, (path, name) in enumerate(zip(files, names, strict=True), 1):
            digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
            log(f"[{number}/{len(files)}] s3://{bucket}/{prefix}{name} ({path.stat().st_size:,} bytes)")
            s3_client.upload_file(str(path), bucket, prefix + name)
    manifest = {"model_id": model_id, "revision": revision, "files": digests}
    s3_client.put_object(Bucket=bucket, Key=prefix + MANIFEST, Body=json.dumps(manifest, indent=1).encode(),
                         ContentType="application/json")
    return f"s3://{bucket}/{prefix}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.llm.lmi stage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", required=True, help="Hugging Face model id, e.g. Qwen/Qwen3-8B")
    parser.add_argument("--revision", required=True, help="the commit hash to stage (40 hex characters)")
    parser.add_argument("--s3-uri", required=True, help="s3://bucket/prefix/ (the revision becomes a sub-folder)")
    parser.add_argument("--hf-token-secret", help="Secrets Manager secret holding a token, for gated models")
    parser.add_argument("--region", help="AWS region of the bucket and the secret (default: the CLI's)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    token = None
    try:
        token = hub_token(args.hf_token_secret, args.region)
        uri = stage(args.model_id, args.revision, args.s3_uri, token=token, region=args.region,
                    log=lambda line: print(line, file=sys.stderr))
    except StageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # network, permissions: one line, and never the token
        message = str(error).replace(token, "***") if token else str(error)
        print(f"error: {type(error).__name__}: {message}", file=sys.stderr)
        return 1
    print(f"falcon.model_s3_uri={uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
