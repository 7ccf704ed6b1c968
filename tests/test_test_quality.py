"""A check of the tests themselves: every test can fail, and every skip says why.

The rule, read from each test module's syntax tree (no test is run):
- A test function (`test_*` at module level or in a `Test*` class) must contain an assertion somewhere in its body:
  an `assert` statement; `pytest.raises`, `pytest.warns`, `pytest.fail` or `pytest.deprecated_call`; a method whose
  name starts with `assert` (`Stubber.assert_no_pending_responses`, `Mock.assert_called_once_with`, ...) or one of
  the CDK `Template` checks that raise on a mismatch (`has_resource_properties`, `resource_count_is`, ...); or a call
  of a helper that itself asserts by this rule (a function of the same module, or one imported from `tests.`).
  Calls are resolved by name only; a test that delegates its assertion to anything else is reported, and must
  then assert in its own body.
- Every skip gives its reason: `pytest.mark.skip`/`skipif` with `reason=` (or the positional reason of `skip`),
  `pytest.skip(...)` with a message, `pytest.importorskip(...)` with `reason=` (better: a plain import).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO_ROOT = TESTS.parent
PYTEST_CHECKS = {"raises", "warns", "fail", "deprecated_call"}
# aws_cdk.assertions.Template methods that raise when the template does not match.
TEMPLATE_CHECKS = {"has_resource_properties", "has_resource", "resource_count_is", "resource_properties_count_is",
                   "has_output", "has_mapping", "has_condition", "has_parameter", "all_resources",
                   "all_resources_properties", "template_matches"}


def _test_modules() -> list[Path]:
    return sorted(path for path in TESTS.rglob("test_*.py") if "__pycache__" not in path.parts)


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _module_path(dotted: str) -> Path | None:
    """The file of a `tests.` module, or None for anything else."""
    if dotted != "tests" and not dotted.startswith("tests."):
        return None
    base = REPO_ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _names(path: Path) -> dict[str, tuple[Path, str]]:
    """Callable names a module can use -> (module file, function name): its own functions and tests.* imports."""
    tree = _parse(path)
    names: dict[str, tuple[Path, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = (path, node.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                source = _module_path(node.module)
                if source is not None:
                    names[alias.asname or alias.name] = (source, alias.name)
                elif _module_path(f"{node.module}.{alias.name}") is not None:  # from tests import module
                    names[alias.asname or alias.name] = (_module_path(f"{node.module}.{alias.name}"), "")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _module_path(alias.name) is not None and alias.asname:
                    names[alias.asname] = (_module_path(alias.name), "")
    return names


def _function(path: Path, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    return None


def _asserts(path: Path, function: ast.AST, seen: frozenset = frozenset()) -> bool:
    """Whether `function` (defined in `path`) contains an assertion by the module docstring's rule."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            return True
        if not isinstance(node, ast.Call):
            continue
        callee = node.func
        if isinstance(callee, ast.Attribute):
            if callee.attr.startswith("assert") or callee.attr in TEMPLATE_CHECKS:
                return True
            if isinstance(callee.value, ast.Name):
                if callee.value.id == "pytest" and callee.attr in PYTEST_CHECKS:
                    return True
                target = _names(path).get(callee.value.id)
                if target and target[1] == "" and _helper_asserts(target[0], callee.attr, seen):
                    return True
        elif isinstance(callee, ast.Name):
            target = _names(path).get(callee.id)
            if target and target[1] and _helper_asserts(target[0], target[1], seen):
                return True
    return False


def _helper_asserts(path: Path, name: str, seen: frozenset) -> bool:
    if (path, name) in seen:
        return False
    helper = _function(path, name)
    return helper is not None and _asserts(path, helper, seen | {(path, name)})


def _tests(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            yield node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            yield from (item for item in node.body
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test"))


def _display(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def weak_tests(path: Path) -> list[str]:
    return [f"{_display(path)}:{test.lineno} {test.name}"
            for test in _tests(_parse(path)) if not _asserts(path, test)]


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def unexplained_skips(path: Path) -> list[str]:
    problems = []
    calls = [node for node in ast.walk(_parse(path)) if isinstance(node, ast.Call)]
    called = {id(call.func) for call in calls}
    for node in ast.walk(_parse(path)):
        # A bare decorator (`@pytest.mark.skip`, not called) has no reason at all.
        if isinstance(node, ast.Attribute) and id(node) not in called and \
                _dotted(node) in ("pytest.mark.skip", "pytest.mark.skipif"):
            problems.append(f"{_display(path)}:{node.lineno} {_dotted(node)} without a reason")
    for call in calls:
        name, keywords = _dotted(call.func), {keyword.arg for keyword in call.keywords}
        positional_reason = name in ("pytest.mark.skip", "pytest.skip") and call.args
        if name in ("pytest.mark.skip", "pytest.mark.skipif", "pytest.skip", "pytest.importorskip") and \
                "reason" not in keywords and not positional_reason:
            problems.append(f"{_display(path)}:{call.lineno} {name} without a reason")
    return sorted(problems, key=lambda problem: int(problem.split(":")[1].split()[0]))


def package_skips(path: Path) -> list[str]:
    return [f"{_display(path)}:{call.lineno} pytest.importorskip: import it (a missing package must fail)"
            for call in ast.walk(_parse(path))
            if isinstance(call, ast.Call) and _dotted(call.func) == "pytest.importorskip"]


def test_every_test_has_an_assertion():
    modules = _test_modules()
    assert len(modules) > 40  # the walk found the suite
    assert [problem for path in modules for problem in weak_tests(path)] == []


def test_every_skip_says_why():
    assert [problem for path in _test_modules() for problem in unexplained_skips(path)] == []


def test_no_test_skips_for_a_missing_package():
    assert [problem for path in _test_modules() for problem in package_skips(path)] == []


# --- the check can fail -------------------------------------------------------------------------------------------

BAD_MODULE = '''
import pytest
from tests.conftest import read_templates

def helper_that_asserts(x):
    assert x

def helper_that_does_not(x):
    return x

def test_plain_assert():
    assert 1

def test_through_helper():
    helper_that_asserts(1)

def test_through_raises():
    with pytest.raises(ValueError):
        int("x")

def test_template(template):
    template.has_resource_properties("AWS::S3::Bucket", {})

def test_nothing():
    helper_that_does_not(1)

def test_only_calls_code():
    read_templates(None)

@pytest.mark.skip
def test_bare_skip():
    assert 1

@pytest.mark.skipif(True)
def test_skipif_without_reason():
    assert 1

@pytest.mark.skipif(True, reason="documented")
def test_skipif_with_reason():
    assert 1

def test_imports_or_skips():
    pytest.importorskip("json")
    pytest.skip()
'''


def test_the_check_finds_tests_that_cannot_fail_and_unexplained_skips(tmp_path):
    module = tmp_path / "test_weak.py"
    module.write_text(BAD_MODULE)
    weak = [line.split()[-1] for line in weak_tests(module)]
    skips = [line.split(" ", 1)[1] for line in unexplained_skips(module)]
    assert weak == ["test_nothing", "test_only_calls_code", "test_imports_or_skips"]
    assert skips == ["pytest.mark.skip without a reason", "pytest.mark.skipif without a reason",
                     "pytest.importorskip without a reason", "pytest.skip without a reason"]
    assert [line.split(" ", 1)[1] for line in package_skips(module)] == [
        "pytest.importorskip: import it (a missing package must fail)"]


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_missing_prerequisite_fails_under_ci_and_skips_with_its_reason_elsewhere(tmp_path, ci):
    import os
    import subprocess
    import sys

    module = tmp_path / "test_needs_a_tool.py"
    module.write_text("from tests.conftest import prerequisite\n\n"
                      "pytestmark = prerequisite(False, 'no frobnicator on PATH')\n\n\n"
                      "def test_uses_it():\n    assert True\n")
    env = {**os.environ, "CI": ci}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                             "-rs", "--rootdir", str(tmp_path), str(module)], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    if ci:
        assert result.returncode == 1, result.stdout
        assert "CI=true and a prerequisite is missing: no frobnicator on PATH" in result.stdout
    else:
        assert result.returncode == 0, result.stdout
        assert "1 skipped" in result.stdout and "no frobnicator on PATH" in result.stdout
