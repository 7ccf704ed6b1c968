"""The generated reference pages: every setting (docs/reference/settings.md) and every CLI's --help
(docs/reference/cli.md), made from the code so they cannot drift from it.

    python -m docs.reference --write   # = make docs, after changing a setting or a CLI
    python -m docs.reference --check   # exit 1 when a page is stale (make test: tests/test_docs.py)

Settings come from the catalogue `make settings` prints (settings.catalogue(), the JSON Schema pydantic makes of the
declarations), with the same type and allowed-value words. CLIs are found, not listed: every module under the
code folders with `if __name__ == "__main__":` or a `__main__.py`. All of them run with `--help` (and
`<command> --help` for each subcommand) in one child process, about a second for all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import re
import runpy
import subprocess
import sys
import unicodedata
import warnings
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO_ROOT / "docs" / "reference"
SETTINGS_PAGE = REFERENCE_DIR / "settings.md"
CLI_PAGE = REFERENCE_DIR / "cli.md"
REGENERATE = "make docs"
CODE_FOLDERS = ("settings", "stacks", "training", "inference", "lambdas", "tests", "docs")
NOT_TOOLS = {"tests.falcon_benchmark.fake_cdk": "a stand-in for the CDK CLI inside the Falcon benchmark's tests"}
HELP_COLUMNS = "100"  # argparse wraps to the terminal's width: fixed, so the page is the same on every machine


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------------------------------------------- settings


def settings_page() -> str:
    from settings import catalogue, load_with_sources, read_context
    from settings.cli import show_value, type_name
    from settings.fields import describe_allowed

    lines = [
        "# Settings reference",
        "",
        f"Generated from the settings models by `{REGENERATE}`; do not edit by hand. Every setting, its type, default,",
        "allowed values, unit and meaning, as `make settings` prints them. Set one in `cdk.json` (see",
        "[Environments and settings](../settings.md)) or per command with `-c key=value`;",
        "`make settings ENV=prod` shows the value each environment deploys with and where it came from.",
        "",
    ]
    sections: dict[str, list[tuple[str, dict]]] = {}
    for key, schema in catalogue().items():
        sections.setdefault(key.split(".")[0] if "." in key else "(top level)", []).append((key, schema))
    for section, entries in sections.items():
        lines += [f"## {section}", "", "| setting | type | default | allowed | unit | description |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for key, schema in entries:
            lines.append(f"| `{key}` | {_cell(type_name(schema))} | `{_cell(show_value(schema.get('default')))}` | "
                         f"{_cell(describe_allowed(schema))} | {_cell(schema.get('unit') or '')} | "
                         f"{_cell(schema.get('description', ''))} |")
        lines.append("")
    environments, _ = read_context()
    lines += ["## What each environment changes", "",
              "The values `cdk.json` gives where they differ from the defaults above: `context.shared` for every",
              "environment, then each environment's own block.", "",
              "| environment | setting | value | from |", "| --- | --- | --- | --- |"]
    shown_shared = False
    for name in environments:
        settings, sources = load_with_sources(name, {})
        for key, source in sources.items():
            if source == "default" or (source == "cdk.json shared" and shown_shared):
                continue
            value = functools.reduce(getattr, key.split("."), settings)
            scope = "every environment" if source == "cdk.json shared" else name
            lines.append(f"| {scope} | `{key}` | `{_cell(show_value(value))}` | {_cell(source)} |")
        shown_shared = True
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------------- CLIs


def cli_modules() -> list[str]:
    """Every module of ours that runs as a program, in path order."""
    found = []
    for folder in CODE_FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if path.name == "__main__.py":
                module = ".".join(path.parent.relative_to(REPO_ROOT).parts)
            elif re.search(r'^if __name__ == "__main__":', text, flags=re.MULTILINE):
                module = ".".join(path.with_suffix("").relative_to(REPO_ROOT).parts)
            else:
                continue
            if module not in NOT_TOOLS and module not in found:
                found.append(module)
    return found


@contextlib.contextmanager
def _help_context(argv: list[str]) -> Iterator[tuple[io.StringIO, list[argparse.ArgumentParser]]]:
    """Run with `argv`, stdout captured, the terminal width fixed, this checkout's path shown as a relative one,
    and every parser that parses recorded (the first is the program's own)."""
    root = str(REPO_ROOT)
    parsers: list[argparse.ArgumentParser] = []
    parse_known_args = argparse.ArgumentParser.parse_known_args

    def recording(self, *args, **kwargs):
        parsers.append(self)
        return parse_known_args(self, *args, **kwargs)

    def relative(method):
        # Defaults such as a handler's absolute path: hidden before wrapping, so any clone's page wraps alike.
        return lambda self, text, *rest: method(self, text.replace(root + os.sep, "").replace(root, "."), *rest)

    patches = [mock.patch.object(argparse.ArgumentParser, "parse_known_args", recording),
               mock.patch.dict(os.environ, {"COLUMNS": HELP_COLUMNS}),
               mock.patch.object(sys, "argv", ["program", *argv])]
    for cls in (argparse.HelpFormatter, argparse.RawDescriptionHelpFormatter, argparse.RawTextHelpFormatter):
        for name in ("_split_lines", "_fill_text"):
            if name in vars(cls):
                patches.append(mock.patch.object(cls, name, relative(vars(cls)[name])))
    output = io.StringIO()
    with contextlib.ExitStack() as stack, warnings.catch_warnings():
        # runpy's note that it runs a module already imported (by an earlier program of this loop) as __main__.
        warnings.filterwarnings("ignore", message=r".* found in sys\.modules after import of package",
                                category=RuntimeWarning)
        for patch in patches:
            stack.enter_context(patch)
        stack.enter_context(contextlib.redirect_stdout(output))
        stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
        yield output, parsers


def help_text(module: str, argv: list[str]) -> tuple[str, dict[str, str]]:
    """What `python -m module *argv` prints, and the subcommands of the parser it used with their help."""
    with _help_context(argv) as (output, parsers), contextlib.suppress(SystemExit):
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    subcommands = {}
    for action in parsers[0]._actions if parsers else []:
        if isinstance(action, argparse._SubParsersAction):
            described = {choice.dest: choice.help for choice in action._choices_actions}
            subcommands.update({name: described.get(name) or "" for name in action.choices})
    text = output.getvalue().replace(str(REPO_ROOT) + os.sep, "").rstrip()
    return text, subcommands


def _first_sentence(text: str) -> str:
    """The tool's description in one sentence: the first paragraph after the usage block, up to its first full stop."""
    paragraphs = [part.strip() for part in re.split(r"\n\s*\n", text) if part.strip()]
    for paragraph in paragraphs:
        if not paragraph.lower().startswith(("usage:", "options:", "positional arguments:")):
            joined = re.sub(r"(?<=\w-) (?=\w)", "", " ".join(paragraph.split()))  # argparse wraps at hyphens
            return re.split(r"(?<=[.:])\s", joined, maxsplit=1)[0]
    return ""


def collect_helps() -> dict[str, dict[str, str]]:
    """Every program's --help (and each subcommand's), run in this process: call it in a process of its own (as
    `cli_page` does), since programs install signal handlers before they parse their arguments."""
    helps: dict[str, str] = {}
    summaries: dict[str, str] = {}
    for module in cli_modules():
        text, subcommands = help_text(module, ["--help"])
        helps[module] = text
        for command, described in subcommands.items():
            helps[f"{module} {command}"] = help_text(module, [command, "--help"])[0]
            summaries[f"{module} {command}"] = described
    return {"helps": helps, "summaries": summaries}


def cli_page() -> str:
    collected = subprocess.run([sys.executable, "-m", "docs.reference", "--collect"], cwd=REPO_ROOT, check=True,
                               capture_output=True, text=True).stdout
    helps, summaries = (json.loads(collected)[part] for part in ("helps", "summaries"))
    first_with: dict[str, str] = {}
    lines = [
        "# CLI reference",
        "",
        f"Generated by `{REGENERATE}` from each program's own `--help`; do not edit by hand. Every tool runs from the",
        "repository root as `.venv/bin/python -m <module>` (the server from `.venv-image/`, see",
        "[Sentiment hosting](../sentiment-hosting.md)); the `make` targets that wrap them are in the",
        "[README](../../README.md#make-targets).",
        "",
        "| program | what it does |",
        "| --- | --- |",
    ]
    body = []
    for name, text in helps.items():
        anchor = github_slugs([name])[0]
        same = first_with.setdefault(text, name)
        summary = (f"the same program as [`{same}`](#{github_slugs([same])[0]})" if same != name
                   else summaries.get(name) or _first_sentence(text))
        lines.append(f"| [`{name}`](#{anchor}) | {_cell(summary)} |")
        body += [f"## {name}", ""]
        if same != name:
            body += [f"`python -m {name}` runs [`{same}`](#{github_slugs([same])[0]}).", ""]
        else:
            body += [f"`python -m {name} --help`", "", "```text", text, "```", ""]
    return "\n".join([*lines, "", *body]).rstrip() + "\n"


# ------------------------------------------------------------------------------------------ GitHub's anchors


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: github-slugger's `slug` (github.com/Flet/github-slugger, index.js:
    lowercase, delete the characters of script/generate-regex.mjs's Unicode categories, each space to '-', no trim)."""
    kept = []
    for char in heading.lower():
        category = unicodedata.category(char)
        removed = (category in _REMOVED_CATEGORIES or (category[0] in "SZ" and char != " ")
                   or (category == "Pd" and char != "-"))
        if not removed or char.isalpha():  # letters that Unicode also files as symbols stay (the regex's
            kept.append(char)              # `.remove(alphabetics)`)
    return "".join(kept).replace(" ", "-")


def github_slugs(headings: list[str]) -> list[str]:
    """Anchors of a page's headings in order: a repeated slug gets -1, -2, ... (github-slugger's `occurrences`)."""
    occurrences: dict[str, int] = {}
    slugs = []
    for heading in headings:
        original = result = github_slug(heading)
        while result in occurrences:
            occurrences[original] += 1
            result = f"{original}-{occurrences[original]}"
        occurrences[result] = 0
        slugs.append(result)
    return slugs


# Other_Number, the punctuation classes but '-' and '_' (Connector_Punctuation stays), Control, Private_Use, Format,
# Unassigned; symbols and separators are handled above.
_REMOVED_CATEGORIES = {"No", "Pe", "Pf", "Pi", "Ps", "Po", "Cc", "Co", "Cf", "Cn"}


# ------------------------------------------------------------------------------------------------------- main


def pages() -> dict[Path, str]:
    return {SETTINGS_PAGE: settings_page(), CLI_PAGE: cli_page()}


def stale_pages() -> list[Path]:
    return [path for path, text in pages().items()
            if not path.exists() or path.read_text(encoding="utf-8") != text]


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.reference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the reference pages")
    mode.add_argument("--check", action="store_true", help="exit 1 when a checked-in page is stale")
    mode.add_argument("--collect", action="store_true", help=argparse.SUPPRESS)  # cli_page's child process
    args = parser.parse_args(argv)
    if args.collect:
        print(json.dumps(collect_helps()))
        return 0
    if args.write:
        REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
        for path, text in pages().items():
            path.write_text(text, encoding="utf-8")
            print(f"wrote {_shown(path)}")
        return 0
    stale = stale_pages()
    for path in stale:
        print(f"{_shown(path)} is stale: run {REGENERATE}", file=sys.stderr)
    if not stale:
        print("the reference pages are current")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
