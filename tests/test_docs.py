"""The docs: generated reference pages are current, and every relative link and #anchor resolves as on GitHub."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docs import reference
from docs.reference import github_slug, github_slugs

REPO_ROOT = Path(__file__).resolve().parent.parent
SKIPPED_FOLDERS = {"node_modules", "cdk.out", "artifacts", "build", "runs"}


# ------------------------------------------------------------------------------------- generated reference


def test_reference_pages_are_current():
    assert reference.stale_pages() == [], "run: make docs (python -m docs.reference --write)"
    assert reference.main(["--check"]) == 0


def test_a_stale_page_is_reported(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "settings.md"
    stale.write_text("# Settings reference\n")
    monkeypatch.setattr(reference, "SETTINGS_PAGE", stale)
    assert reference.main(["--check"]) == 1
    assert "settings.md is stale: run make docs" in capsys.readouterr().err


def test_changing_a_description_without_regenerating_fails(monkeypatch):
    import settings

    changed = {key: dict(schema) for key, schema in settings.catalogue().items()}
    changed["sentiment.max_queue"]["description"] = "a description nobody regenerated"
    monkeypatch.setattr(settings, "catalogue", lambda: changed)
    page = reference.settings_page()
    assert "a description nobody regenerated" in page
    assert page != reference.SETTINGS_PAGE.read_text(encoding="utf-8")


def _table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 6 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    return rows


def test_the_settings_page_says_what_make_settings_json_says():
    """Every setting `python -m settings --json` lists, with the same type, allowed values, unit and meaning."""
    printed = subprocess.run([sys.executable, "-m", "settings", "--json"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout
    rows = _table_rows(reference.SETTINGS_PAGE.read_text(encoding="utf-8"))
    described = json.loads(printed)
    assert sorted(rows) == sorted(row["key"] for row in described)
    for row in described:
        _, type_name, _, allowed, unit, description = rows[row["key"]]
        assert (type_name, allowed, unit, description) == (row["type"], row["allowed"], row["unit"] or "",
                                                           row["description"]), row["key"]


def test_every_program_is_in_the_cli_reference():
    page = reference.CLI_PAGE.read_text(encoding="utf-8")
    headings = set(re.findall(r"^## (.+)$", page, flags=re.MULTILINE))
    for module in reference.cli_modules():
        assert module in headings, module
    assert "inference.llm.lmi stage" in headings and "inference.sentiment.server serve" in headings
    assert "tests.falcon_benchmark.fake_cdk" not in headings  # a test double, not a tool


@pytest.mark.parametrize("argv", [["settings", "--help"], ["inference.llm.lmi", "stage", "--help"]])
def test_the_page_shows_what_the_program_itself_prints(argv):
    """In-process collection equals a real run (here two cheap programs, one a subcommand dispatched by hand)."""
    real = subprocess.run([sys.executable, "-m", *argv], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": reference.HELP_COLUMNS}, check=True).stdout
    page = reference.CLI_PAGE.read_text(encoding="utf-8")
    assert f"```text\n{real.rstrip()}\n```" in page


# ----------------------------------------------------------------------------------------- GitHub's anchors


@pytest.mark.parametrize(("headings", "expected"), [
    # github-slugger test/fixtures.json (github.com/Flet/github-slugger, commit 285fe87d).
    (["alpha", "alpha"], ["alpha", "alpha-1"]),
    (["echo", "echo", "echo 1", "echo-1", "echo"], ["echo", "echo-1", "echo-1-1", "echo-1-2", "echo-2"]),
    (["foxtrot-1", "foxtrot", "foxtrot"], ["foxtrot-1", "foxtrot", "foxtrot-2"]),
    (["heading with a - dash"], ["heading-with-a---dash"]),
    (["heading with an _ underscore"], ["heading-with-an-_-underscore"]),
    (["exchange.bind_headers(exchange, routing [, bindCallback])"],
     ["exchangebind_headersexchange-routing--bindcallback"]),
    (["apostrophe’s should be trimmed"], ["apostrophes-should-be-trimmed"]),
    (["I ♥ unicode", "en–dash", "😄 - an emoji"], ["i--unicode", "endash", "---an-emoji"]),
    (["Привет non-latin 你好"], ["привет-non-latin-你好"]),
    # A heading of this project, as GitHub anchored it in the README before this change.
    (["The retired TorchServe image (sentiment.runtime=dlc)"], ["the-retired-torchserve-image-sentimentruntimedlc"]),
])
def test_slugs_follow_github_slugger(headings, expected):
    assert github_slugs(headings) == expected


# ---------------------------------------------------------------------------------------------------- links


def markdown_files() -> list[Path]:
    return sorted(path for path in REPO_ROOT.rglob("*.md")
                  if not any(part.startswith(".") or part in SKIPPED_FOLDERS
                             for part in path.relative_to(REPO_ROOT).parts))


FENCE = re.compile(r"^\s{0,3}(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)))
    return lines


def heading_text(line: str) -> str | None:
    """A heading line's text as GitHub renders it: code spans keep their content, links their text, emphasis
    markers and inline HTML go."""
    match = re.match(r"^\s{0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$", line)
    if not match:
        return None
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1))
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"(\*\*|__|\*)", "", text)


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    headings, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (heading := heading_text(line)) is not None:
            headings.append(heading)
    return set(github_slugs(headings)) | set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for target in [*LINK.findall(line), *DEFINITION.findall(line)]:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE):  # https:, mailto:
                continue
            where = f"{path.relative_to(REPO_ROOT)}:{number}: {target}"
            file_part, _, anchor = target.partition("#")
            resolved = (REPO_ROOT / file_part.lstrip("/") if file_part.startswith("/")
                        else (path.parent / file_part).resolve() if file_part else path)
            if not resolved.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where} (no heading with that anchor)")
            elif anchor and resolved.suffix != ".md" and not _line_anchor_fits(resolved, anchor):
                problems.append(f"{where} (not a line of that file)")
    return problems


def _line_anchor_fits(path: Path, anchor: str) -> bool:
    """GitHub's #L10 / #L10-L20 line anchors, for links into code."""
    match = re.fullmatch(r"L(\d+)(?:-L(\d+))?", anchor)
    if not match or path.is_dir():
        return False
    count = len(path.read_text(encoding="utf-8").splitlines())
    return all(int(line) <= count for line in match.groups() if line)


def test_every_relative_link_and_anchor_resolves():
    files = markdown_files()
    assert REPO_ROOT / "README.md" in files and len([f for f in files if "docs" in f.parts]) >= 5
    problems = [problem for path in files for problem in broken_links(path)]
    assert problems == []


def test_the_checker_finds_a_broken_file_anchor_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
    (tmp_path / "code.py").write_text("a = 1\nb = 2\n")
    (tmp_path / "other.md").write_text("# A `code` title\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "# Page", "", "[ok](other.md#a-code-title) [ok](other.md#twice-1) [ok](#page) [ok](code.py#L2)",
        "[ok](https://example.com/x) `[not a link](nowhere.md)`", "```", "[in a fence](nowhere.md)", "```",
        "[gone](missing.md) [bad anchor](other.md#twice-2) [bad line](code.py#L3) [self](#nope)",
    ]))
    assert [problem.split(": ", 1)[1] for problem in broken_links(page)] == [
        "missing.md (no such file)", "other.md#twice-2 (no heading with that anchor)",
        "code.py#L3 (not a line of that file)", "#nope (no heading with that anchor)"]
    assert github_slug("A code title") == "a-code-title"


# --------------------------------------------------------------------------------------------------- pages

NOT_TASK_PAGES = {"README.md", "feature-flags.md"}  # the index, and a review table


def test_each_task_page_ends_with_what_stays_unverified():
    pages = [path for path in sorted((REPO_ROOT / "docs").glob("*.md"))
             if path.name not in NOT_TASK_PAGES and not path.name.startswith("incoming-")]
    assert len(pages) >= 10
    for path in pages:
        headings = re.findall(r"^## (.+)$", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
        assert headings and headings[-1] == "What stays unverified", path.name


# --------------------------------------------------------------------------------------------------- README


def test_the_readme_is_short_and_names_the_two_set_up_commands():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert "make synth" in readme and "make test" in readme


def test_the_readme_lists_every_make_target_make_help_lists():
    documented = re.findall(r"^([a-z0-9-]+):.*## ", (REPO_ROOT / "Makefile").read_text(), flags=re.MULTILINE)
    table = (REPO_ROOT / "README.md").read_text(encoding="utf-8").split("## Make targets", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`make ([a-z0-9-]+)`", table))
    assert sorted(set(documented) - {"help"} - listed) == []
