"""The serving image's supply chain, offline: its locks agree with its pins, and its base moves by digest only.

    python -m inference.sentiment.image.supply_chain check
    python -m inference.sentiment.image.supply_chain bump-base --digest sha256:<64 hex> [--tag 3.13-slim-trixie]
    python -m inference.sentiment.image.supply_chain subset starlette uvicorn ...   # those entries of the lock

`check` holds requirements.lock (hashes, from `make image-lock`) and torch.lock to requirements.txt: the same
packages at the same versions, every entry with at least one sha256. `bump-base` rewrites the Dockerfile's
`ARG BASE_IMAGE=<registry>/python:<tag>@sha256:<digest>` line (`make bump-base DIGEST=...`); it needs no network:
the digest is the one the registry lists for the tag's linux/arm64 manifest (docs: "Moving the base image").

Exit status: 0 done, 1 the locks disagree with the pins, 2 a bad argument or file.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PROG = "python -m inference.sentiment.image.supply_chain"
IMAGE_DIR = Path(__file__).resolve().parent
DOCKERFILE = IMAGE_DIR / "Dockerfile"
REQUIREMENTS = IMAGE_DIR / "requirements.txt"
LOCK = IMAGE_DIR / "requirements.lock"
TORCH_LOCK = IMAGE_DIR / "torch.lock"
# torch's CPU build carries this local version label on Linux (PyTorch's CPU index).
TORCH_LOCAL = "+cpu"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
BASE_LINE = re.compile(r"^ARG BASE_IMAGE=(?P<repository>[^:@\s]+(?::\d+)?/[^:@\s]+):(?P<tag>[^@\s]+)"
                       r"@(?P<digest>sha256:[0-9a-f]{64})$", re.M)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


class SupplyChainError(ValueError):
    """A file or argument the tool cannot work with; one line for the user."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """{normalized name: version} of a requirements or lock file's `name==version` lines."""
    found = {}
    for line in path.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            found[normalize(match.group(1))] = match.group(2)
    return found


def hashes(path: Path) -> dict[str, list[str]]:
    """{normalized name: its sha256 digests} of a lock file (`name==version \\` then `--hash=sha256:...` lines)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            current = normalize(match.group(1))
            found[current] = []
        elif current and line.strip().startswith("--hash=sha256:"):
            found[current].append(line.strip().removeprefix("--hash=sha256:").rstrip(" \\"))
        elif not line.startswith((" ", "\t")):
            current = None
    return found


def lock_problems(requirements: Path = REQUIREMENTS, lock: Path = LOCK, torch_lock: Path = TORCH_LOCK) -> list[str]:
    """Where the locks and the pins disagree (empty when they agree)."""
    wanted = pins(requirements)
    locked = pins(lock)
    torch_locked = pins(torch_lock)
    problems = []
    torch = wanted.pop("torch", None)
    if torch is None:
        problems.append(f"{requirements.name} pins no torch")
    elif torch_locked.get("torch") != torch + TORCH_LOCAL:
        problems.append(f"{torch_lock.name} pins torch {torch_locked.get('torch')}, {requirements.name} "
                        f"{torch} (expected {torch}{TORCH_LOCAL})")
    for name, version in sorted(wanted.items()):
        if locked.get(name) != version:
            problems.append(f"{name}: {requirements.name} pins {version}, {lock.name} has {locked.get(name)}")
    for name in sorted(set(locked) - set(wanted)):
        problems.append(f"{name}=={locked[name]} is in {lock.name} but not pinned in {requirements.name}")
    for path in (lock, torch_lock):
        for name, digests in sorted(hashes(path).items()):
            if not digests or not all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in digests):
                problems.append(f"{path.name}: {name} has no valid sha256 --hash")
    if problems:
        problems.append(f"re-lock with `make image-lock` ({lock.name}); torch's CPU wheel digests go in "
                        f"{torch_lock.name} by hand")
    return problems


def subset(names: list[str], lock: Path = LOCK) -> str:
    """The lock's entries (pin and hash lines) for `names`: a smaller hashed lock, e.g. the server's pure-Python
    packages for a CPython 3.13 venv on a machine without an aarch64 torch (`make image-venv-py313`)."""
    wanted = {normalize(name) for name in names}
    kept, keep = [], False
    for line in lock.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            keep = normalize(match.group(1)) in wanted
            wanted.discard(normalize(match.group(1))) if keep else None
        elif not line.startswith((" ", "\t")):
            keep = False
        if keep and not line.strip().startswith("#"):
            kept.append(line)
    if wanted:
        raise SupplyChainError(f"{lock.name} has no {', '.join(sorted(wanted))}")
    return "\n".join(kept) + "\n"


def bump_base(dockerfile: Path, digest: str, tag: str | None = None) -> tuple[str, str]:
    """Point the Dockerfile's base at `digest` (and `tag`); returns (old reference, new reference)."""
    if not DIGEST.match(digest):
        raise SupplyChainError(f"--digest {digest!r}: expected sha256: followed by 64 lowercase hex digits")
    if tag is not None and not TAG.match(tag):
        raise SupplyChainError(f"--tag {tag!r}: not a valid image tag")
    text = dockerfile.read_text()
    lines = BASE_LINE.findall(text)
    if len(lines) != 1:
        raise SupplyChainError(f"{dockerfile}: expected one 'ARG BASE_IMAGE=<repository>:<tag>@sha256:<digest>' "
                               f"line, found {len(lines)}")
    match = BASE_LINE.search(text)
    old = f"{match['repository']}:{match['tag']}@{match['digest']}"
    new = f"{match['repository']}:{tag or match['tag']}@{digest}"
    dockerfile.write_text(text[:match.start()] + f"ARG BASE_IMAGE={new}" + text[match.end():])
    return old, new


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog="Exit status: 0 done, 1 locks disagree with pins, 2 bad argument.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="the locks agree with requirements.txt and carry hashes")
    bump = commands.add_parser("bump-base", help="rewrite the Dockerfile's base image digest")
    bump.add_argument("--digest", required=True, help="sha256:<64 hex>: the tag's linux/arm64 manifest digest")
    bump.add_argument("--tag", help="a new tag of the same repository (default: keep the current one)")
    bump.add_argument("--dockerfile", type=Path, default=DOCKERFILE, help="the Dockerfile to rewrite")
    pick = commands.add_parser("subset", help="print the lock's entries for these packages, hashes included")
    pick.add_argument("names", nargs="+", help="package names")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "check":
            problems = lock_problems()
            for line in problems:
                print(f"{PROG}: {line}", file=sys.stderr)
            if not problems:
                print(f"{LOCK.name} and {TORCH_LOCK.name} agree with {REQUIREMENTS.name}; every entry is hashed")
            return 1 if problems else 0
        if args.command == "subset":
            sys.stdout.write(subset(args.names))
            return 0
        old, new = bump_base(args.dockerfile, args.digest, args.tag)
    except (SupplyChainError, OSError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    if old == new:
        print(f"base already {new}")
    else:
        print(f"base image: {old}\n         -> {new}\nUpdate the Dockerfile's comment on the base (build date, "
              "versions), then build and test the image (docs: \"Moving the base image\").")
    return 0


if __name__ == "__main__":
    sys.exit(main())
