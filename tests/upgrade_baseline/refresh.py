"""Write the upgrade test's baseline: the templates a released commit synthesizes (prod, every workload on).

    python -m tests.upgrade_baseline.refresh --commit <release commit>

The commit's tree is exported with `git archive` into a temporary folder (the working tree is not touched) and
synthesized there with this checkout's virtual environment, offline, exactly like `cdk synth` does (CDK_CONTEXT_JSON
and CDK_OUTDIR). Each stack's template lands in tests/upgrade_baseline/templates/, with baseline.json naming the
commit and the context. Exit status: 0 written, 1 the synth failed, 2 usage error (unknown commit).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
# prod with every workload on: what tests/test_upgrade.py synthesizes today to compare with.
CONTEXT = {"env": "prod", "training.enabled": "true", "sentiment.enabled": "true",
           "sentiment.model_data_url": "s3://example-bucket/models/sentiment/run-0001/model.tar.gz",
           "falcon.enabled": "true", "falcon.model_s3_uri": "s3://models-bucket/falcon-40b/"}


def synthesize(commit: str, outdir: Path) -> dict[str, dict]:
    """The commit's stacks' templates by stack name."""
    with tempfile.TemporaryDirectory(prefix="baseline-") as temporary:
        tree = Path(temporary) / "tree"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", commit], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        print(f"exported {commit} to {tree}; synthesizing ...", flush=True)
        env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "CDK_"))}
        env.update(JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20", CDK_CONTEXT_JSON=json.dumps(CONTEXT),
                   CDK_OUTDIR=str(outdir), AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null",
                   AWS_EC2_METADATA_DISABLED="true", HF_HUB_OFFLINE="1")
        result = subprocess.run([sys.executable, "app.py"], cwd=tree, env=env, capture_output=True, text=True,
                                timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"synth of {commit} failed:\n{result.stderr[-4000:]}")
    manifest = json.loads((outdir / "manifest.json").read_text())
    return {artifact["displayName"]: json.loads((outdir / artifact["properties"]["templateFile"]).read_text())
            for artifact in manifest["artifacts"].values() if artifact["type"] == "aws:cloudformation:stack"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", required=True, help="the release's commit (any name git rev-parse reads)")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for templates/ and baseline.json")
    args = parser.parse_args(argv)
    resolved = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", f"{args.commit}^{{commit}}"],
                              capture_output=True, text=True)
    if resolved.returncode != 0:
        print(f"error: unknown commit {args.commit!r}", file=sys.stderr)
        return 2
    commit = resolved.stdout.strip()
    with tempfile.TemporaryDirectory(prefix="baseline-out-") as outdir:
        try:
            templates = synthesize(commit, Path(outdir))
        except (RuntimeError, subprocess.SubprocessError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    folder = args.out / "templates"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, template in sorted(templates.items()):
        (folder / f"{name}.template.json").write_text(json.dumps(template, indent=1, sort_keys=True) + "\n")
        print(f"  {name}: {len(template.get('Resources', {}))} resources")
    (args.out / "baseline.json").write_text(json.dumps({"commit": commit, "context": CONTEXT,
                                                        "stacks": sorted(templates)}, indent=1) + "\n")
    print(f"baseline of {commit[:12]} written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
