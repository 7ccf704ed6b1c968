"""Print what a synth produced: each stack of the cloud assembly and how many resources it holds, and for the
pipeline, which tool release its CodeBuild projects install (`npm install -g package@version`).

Usage: python -m stacks.summary [cdk.out]
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

NPM_INSTALL = re.compile(r"npm install -g (\S+)$")


def templates(assembly_dir: Path) -> list[tuple[str, dict]]:
    """(stack, template) for every stack, nested stage assemblies (the pipeline's) included."""
    manifest = json.loads((assembly_dir / "manifest.json").read_text())
    found = []
    for artifact in manifest.get("artifacts", {}).values():
        if artifact.get("type") == "cdk:cloud-assembly":
            found.extend(templates(assembly_dir / artifact["properties"]["directoryName"]))
        elif artifact.get("type") == "aws:cloudformation:stack":
            template_file = artifact["properties"]["templateFile"]
            found.append((artifact.get("displayName", template_file),
                          json.loads((assembly_dir / template_file).read_text())))
    return found


def summarize(assembly_dir: Path) -> list[tuple[str, int, collections.Counter]]:
    """(stack, resource count, resource kinds) for every stack, nested stage assemblies (the pipeline's) included."""
    rows = []
    for name, template in templates(assembly_dir):
        kinds = collections.Counter(r["Type"] for r in template.get("Resources", {}).values())
        rows.append((name, sum(kinds.values()), kinds))
    return sorted(rows)


def installed_tools(assembly_dir: Path) -> collections.Counter:
    """`package@version` -> how many CodeBuild projects install it: what the pipeline's synth, self-mutation and
    asset publishing projects run (CDK Pipelines writes their buildspecs inline)."""
    tools: collections.Counter = collections.Counter()
    for _, template in templates(assembly_dir):
        for resource in template.get("Resources", {}).values():
            if resource["Type"] == "AWS::CodeBuild::Project":
                spec = resource["Properties"].get("Source", {}).get("BuildSpec")
                phases = json.loads(spec).get("phases", {}) if isinstance(spec, str) else {}
                tools.update({match[1] for phase in phases.values() for command in phase.get("commands", [])
                              if (match := NPM_INSTALL.match(command))})
    return tools


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
    if tools := installed_tools(assembly_dir):
        print("pipeline installs: " + ", ".join(f"{tool} ({n} project{'s' if n > 1 else ''})"
                                                for tool, n in sorted(tools.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
