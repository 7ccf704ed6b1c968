"""Print what a synth produced: each stack of the cloud assembly and how many resources it holds.

Usage: python -m stacks.summary [cdk.out]
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path


def summarize(assembly_dir: Path) -> list[tuple[str, int, collections.Counter]]:
    """(stack, resource count, resource kinds) for every stack, nested stage assemblies (the pipeline's) included."""
    manifest = json.loads((assembly_dir / "manifest.json").read_text())
    rows = []
    for artifact in manifest.get("artifacts", {}).values():
        if artifact.get("type") == "cdk:cloud-assembly":
            rows.extend(summarize(assembly_dir / artifact["properties"]["directoryName"]))
            continue
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        template_file = artifact["properties"]["templateFile"]
        template = json.loads((assembly_dir / template_file).read_text())
        kinds = collections.Counter(r["Type"] for r in template.get("Resources", {}).values())
        rows.append((artifact.get("displayName", template_file), sum(kinds.values()), kinds))
    return sorted(rows)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    assembly_dir = Path(args[0] if args else "cdk.out")
    if not (assembly_dir / "manifest.json").exists():
        print(f"error: {assembly_dir} holds no cloud assembly; run `make synth` first", file=sys.stderr)
        return 1
    rows = summarize(assembly_dir)
    width = max((len(name) for name, _, _ in rows), default=10)
    print(f"{'stack'.ljust(width)}  resources  largest kinds")
    for name, count, kinds in rows:
        top = ", ".join(f"{kind.removeprefix('AWS::')} {n}" for kind, n in kinds.most_common(3))
        print(f"{name.ljust(width)}  {count:>9}  {top}")
    print(f"{len(rows)} stacks, {sum(c for _, c, _ in rows)} resources, templates in {assembly_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
