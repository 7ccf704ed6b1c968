"""Write inference/llm/lmi/vllm_engine_args.py from vLLM source distributions, read as text (never imported).

    python -m inference.llm.lmi.vllm_args_gen /tmp/vllm-*/vllm-*.tar.gz > inference/llm/lmi/vllm_engine_args.py

Get each sdist from PyPI without building or installing it, e.g.
`pip download --no-deps --no-build-isolation https://files.pythonhosted.org/.../vllm-0.26.0.tar.gz -d /tmp/vllm-0.26.0`
with VLLM_TARGET_DEVICE=empty (pip prepares metadata only; vLLM is never installed or imported).

What is read, per version, and why it matters to an LMI deployment:
- `vllm/engine/arg_utils.py` class EngineArgs: its annotated fields. DJL Serving passes an `option.X` to vLLM only
  when X is in `EngineArgs.__annotations__` (djl_python/properties_manager/vllm_rb_properties.py,
  get_additional_vllm_engine_args); anything else is dropped without a word.
- the same file: arguments parsed with vLLM's StoreBoolean action (take `--x=false`; 0.8.x only).
- `vllm/config.py` or `vllm/config/*.py`: the gpu_memory_utilization bounds, the model types refused in float16,
  and the file and line of each start-up check the rules in inference.llm.lmi.vllm cite.
- `vllm/model_executor/layers/linear.py`: where KV heads are split or replicated under tensor parallelism.
Exit status: 0 written, 1 an sdist lacks what is read (the message says what), 2 usage.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import pprint
import re
import sys
import tarfile
from pathlib import Path

# Start-up checks whose location is recorded: name -> a piece of the error text vLLM raises there.
CHECK_MESSAGES = {
    "prefill_vs_max_model_len": "smaller than max_model_len",
    "prefill_vs_max_num_seqs": "be greater than or equal to max_num_seqs",
    "attention_heads_vs_tensor_parallel": "must be divisible by tensor parallel size",
    "max_model_len_vs_model": "User-specified max_model_len",
    "unknown_dtype": "Unknown dtype",
}
KV_REPLICATION_TEXT = "num_kv_head_replicas = divide("


class SourceError(Exception):
    """The sdist does not hold what this generator reads."""


def _members(archive: tarfile.TarFile) -> dict[str, str]:
    """Python files under vllm/config*, vllm/engine/arg_utils.py and the linear layers, by path inside vllm/."""
    wanted = re.compile(r"^[^/]+/(vllm/(config\.py|config/[^/]+\.py|engine/arg_utils\.py|"
                        r"model_executor/layers/linear\.py))$")
    files = {}
    for member in archive.getmembers():
        match = wanted.match(member.name)
        if match and member.isfile():
            files[match.group(1)] = archive.extractfile(member).read().decode()
    return files


def _annotation_kind(annotation: str) -> str:
    """bool, int, float, str, literal or other, from the annotation text (Optional and `| None` removed)."""
    text = annotation.replace(" ", "")
    text = re.sub(r"^Optional\[(.*)\]$", r"\1", text)
    parts = [p for p in text.split("|") if p != "None"]
    if len(parts) == 1 and parts[0] in ("bool", "int", "float", "str"):
        return parts[0]
    if len(parts) == 1 and parts[0].startswith("Literal["):
        return "literal"
    return "other"


def _class_fields(tree: ast.Module, name: str) -> dict[str, str]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {item.target.id: ast.unparse(item.annotation) for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
    raise SourceError(f"class {name} not found")


def _store_boolean_arguments(tree: ast.Module) -> list[str]:
    """`add_argument('--x', action=StoreBoolean, ...)` calls: the flags that accept `--x=false`."""
    names = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args):
            continue
        first = node.args[0]
        action = next((k.value for k in node.keywords if k.arg == "action"), None)
        if (isinstance(first, ast.Constant) and isinstance(first.value, str) and isinstance(action, ast.Name)
                and action.id == "StoreBoolean"):
            names.append(first.value.removeprefix("--").replace("-", "_"))
    return sorted(names)


def _gpu_memory_bounds(files: dict[str, str]) -> tuple[str, float | None, float]:
    """(file, exclusive lower bound or None, inclusive upper bound) of gpu_memory_utilization."""
    for path, text in sorted(files.items()):
        if "gpu_memory_utilization" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and node.target.id == "gpu_memory_utilization" and isinstance(node.value, ast.Call)):
                bounds = {k.arg: ast.literal_eval(k.value) for k in node.value.keywords if k.arg in ("gt", "le")}
                if "le" in bounds:
                    return f"{path}:{node.lineno}", bounds.get("gt"), float(bounds["le"])
            if (isinstance(node, ast.Compare) and ast.unparse(node.left) == "self.gpu_memory_utilization"
                    and isinstance(node.ops[0], ast.Gt)):
                return f"{path}:{node.lineno}", None, float(ast.literal_eval(node.comparators[0]))
    raise SourceError("no bound on gpu_memory_utilization found")


def _float16_refused(files: dict[str, str]) -> list[str]:
    for text in files.values():
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == "_FLOAT16_NOT_SUPPORTED_MODELS"):
                return sorted(ast.literal_eval(node.value))
    return []


def _locate(files: dict[str, str], needle: str) -> str:
    for path, text in sorted(files.items()):
        for number, line in enumerate(text.splitlines(), 1):
            if needle in line:
                return f"{path}:{number}"
    raise SourceError(f"{needle!r} not found")


def read_sdist(path: Path) -> dict:
    """Everything recorded for one vLLM version."""
    match = re.fullmatch(r"vllm-(.+)\.tar\.gz", path.name)
    if not match:
        raise SourceError(f"{path.name} is not named vllm-<version>.tar.gz")
    with tarfile.open(path) as archive:
        files = _members(archive)
    if "vllm/engine/arg_utils.py" not in files:
        raise SourceError(f"{path.name} has no vllm/engine/arg_utils.py")
    arg_utils = ast.parse(files["vllm/engine/arg_utils.py"])
    fields = _class_fields(arg_utils, "EngineArgs")
    configs = {p: t for p, t in files.items() if p.startswith("vllm/config")}
    gpu_file, gpu_low, gpu_high = _gpu_memory_bounds(configs)
    checks = {name: _locate(configs, text) for name, text in CHECK_MESSAGES.items()}
    if "vllm/model_executor/layers/linear.py" in files:
        checks["kv_heads_vs_tensor_parallel"] = _locate(files, KV_REPLICATION_TEXT)
    return {
        "version": match.group(1),
        "sdist": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "engine_args": {name: _annotation_kind(annotation) for name, annotation in sorted(fields.items())},
        "store_boolean": _store_boolean_arguments(arg_utils),
        "gpu_memory_utilization": {"source": gpu_file, "greater_than": gpu_low, "at_most": gpu_high},
        "float16_refused_model_types": _float16_refused(configs),
        "checks": checks,
    }


HEADER = '''"""vLLM's engine arguments and start-up checks per version, read from each version's sdist on PyPI.

Generated by `python -m inference.llm.lmi.vllm_args_gen` (see there for how the sdists are fetched); do not edit.
engine_args: the annotated fields of vllm/engine/arg_utils.py EngineArgs, with their kind (bool, int, float, str,
literal, other). checks: file and line of each start-up check, inside the sdist.
"""

'''


def render(records: list[dict]) -> str:
    table = {record["version"]: record for record in records}
    body = pprint.pformat(table, width=116, sort_dicts=False)
    return HEADER + "VLLM_SOURCES = " + body + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.llm.lmi.vllm_args_gen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sdists", nargs="+", type=Path, help="vllm-<version>.tar.gz files")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    records = []
    for path in args.sdists:
        print(f"reading {path}", file=sys.stderr)
        try:
            records.append(read_sdist(path))
        except (SourceError, OSError, tarfile.TarError) as error:
            print(f"error: {path}: {error}", file=sys.stderr)
            return 1
    print(render(records), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
