"""Build the model.tar.gz that the sentiment endpoint (our serving image) loads.

Layout: model and tokenizer files at the root; `onnx/`: the model exported to ONNX
(`inference.sentiment.onnx_export`: `model.fp32.onnx`, `model.int8.onnx` with weights made for the endpoint's CPU,
`--serve-on`, and `export.json` saying what was exported with which versions, or why the export failed; a model that
does not export still packages and serves on torch); `calibration/texts.json`: the gate's held-out texts, on which
the server checks every (engine, precision) pair's accuracy on its own CPU at start and then times the passing ones
(`inference.sentiment.calibration`); `precision.json`: the accuracy gate's figures on this machine
(`inference.sentiment.accuracy_check`), for the packaging report and the model registry. The export goes with the
gate: `--skip-gate` writes neither (the server then chooses among torch's pairs), `--skip-onnx` the gate without
ONNX. No `code/`: the image carries our handler and every package, so nothing is installed when the endpoint starts.
`--handler FILE` adds `code/inference.py` for SageMaker's PyTorch toolkit, which only `make bench-handler`'s toolkit
baseline runs. The model directory and the finished archive are both checked before anything is written to
`--output`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import struct
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from inference.sentiment import int8_target
from training import LABELS

PROG = "python -m training.package"
ROOT = Path(__file__).resolve().parent.parent
# Where SageMaker's PyTorch toolkit imports a handler from (`--handler`; our server reads no code/).
TOOLKIT_HANDLER = "code/inference.py"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# Present in a Trainer checkpoint-* directory, never in a finished model.
CHECKPOINT_MARKERS = ("trainer_state.json", "optimizer.pt", "scheduler.pt")
# Training leftovers that are not needed to serve.
SKIPPED_FILES = ("training_args.bin", "rng_state.pth")
# The gate's record: always measured afresh for the archive, never copied from the model directory.
PRECISION_RECORD = "precision.json"
# The exported ONNX graphs, beside the model files (inference.sentiment.onnx_engine.ONNX_DIR); like the record,
# always made afresh for the archive.
ONNX_DIR = "onnx"
CALIBRATION_TEXTS = "calibration/texts.json"  # inference.sentiment.calibration.TEXTS


class PackageError(ValueError):
    """The model directory or an option cannot make a valid archive; the message is for the user."""


def _safetensors_complete(path: Path) -> bool:
    """True when the file is as long as its header says (an interrupted copy is shorter)."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            return False
        (header_length,) = struct.unpack("<Q", prefix)
        if header_length > size - 8:
            return False
        try:
            header = json.loads(handle.read(header_length))
        except ValueError:
            return False
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    return 8 + header_length + max(ends, default=0) == size


def _weight_files(model_dir: Path) -> list[Path]:
    for name in WEIGHT_FILES:
        if (model_dir / name).is_file():
            return [model_dir / name]
    for name in WEIGHT_INDEXES:
        index = model_dir / name
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            missing = [shard for shard in shards if not (model_dir / shard).is_file()]
            if missing:
                raise PackageError(f"--model-dir {model_dir}: {name} lists missing shard(s) {', '.join(missing)}")
            return [model_dir / shard for shard in shards]
    raise PackageError(f"--model-dir {model_dir}: no weights (expected one of {', '.join(WEIGHT_FILES)})")


def check_model_dir(model_dir: Path) -> dict:
    """Refuse anything but a finished 3-class model with its tokenizer; return its config as a dict."""
    from transformers import AutoConfig, AutoTokenizer

    if not model_dir.is_dir():
        raise PackageError(f"--model-dir {model_dir}: no such directory")
    markers = [name for name in CHECKPOINT_MARKERS if (model_dir / name).exists()]
    if markers:
        raise PackageError(
            f"--model-dir {model_dir}: a Trainer checkpoint (has {', '.join(markers)}), not a finished model; "
            "package the --output-dir of a completed training run"
        )
    if not (model_dir / "config.json").is_file():
        raise PackageError(f"--model-dir {model_dir}: no config.json, not a saved model")
    try:
        config = AutoConfig.from_pretrained(str(model_dir))
    except (OSError, ValueError, KeyError) as error:
        raise PackageError(f"--model-dir {model_dir}: config.json does not load ({error})") from error
    labels = {int(key): value for key, value in (config.id2label or {}).items()}
    if len(labels) != len(LABELS):
        raise PackageError(
            f"--model-dir {model_dir}: config has {len(labels)} labels ({labels}); expected {len(LABELS)} "
            f"({', '.join(LABELS)})"
        )
    for weights in _weight_files(model_dir):
        if weights.suffix == ".safetensors" and not _safetensors_complete(weights):
            raise PackageError(f"--model-dir {model_dir}: {weights.name} is truncated or corrupt")
    if not (model_dir / "tokenizer_config.json").is_file():
        raise PackageError(f"--model-dir {model_dir}: no tokenizer_config.json; save the tokenizer with the model")
    try:
        AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError, TypeError) as error:
        raise PackageError(f"--model-dir {model_dir}: the tokenizer does not load ({error})") from error
    return config.to_dict()


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Root-owned and world-readable: the serving process may not run as the archive's owner."""
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), int(time.time())
    archive.addfile(_normalise(info), io.BytesIO(data))


def verify_archive(path: Path, handler: bool = False) -> list[str]:
    """Member names, after checking the layout the container needs (`handler`: the toolkit's code/inference.py too)
    and that the config loads."""
    from transformers import AutoConfig

    with tarfile.open(path, "r:gz") as archive:
        names = archive.getnames()
        required = ["config.json", "tokenizer_config.json", *([TOOLKIT_HANDLER] if handler else [])]
        missing = [name for name in required if name not in names]
        if not any(name in names for name in WEIGHT_FILES + WEIGHT_INDEXES):
            missing.append(" or ".join(WEIGHT_FILES))
        if missing:
            raise PackageError(f"built archive lacks {', '.join(missing)}")
        with tempfile.TemporaryDirectory() as scratch:
            member = archive.getmember("config.json")
            archive.extract(member, scratch, filter="data")
            AutoConfig.from_pretrained(scratch)
            manifest = f"{ONNX_DIR}/export.json"
            if manifest in names:
                try:
                    json.loads(archive.extractfile(archive.getmember(manifest)).read())
                except ValueError as error:
                    raise PackageError(f"built archive: {manifest} does not parse ({error})") from error
            if PRECISION_RECORD in names:
                from inference.sentiment import precision

                archive.extract(archive.getmember(PRECISION_RECORD), scratch, filter="data")
                try:
                    precision.read_record(Path(scratch))
                except ValueError as error:
                    raise PackageError(f"built archive: {error}") from error
    return names


def build(
    model_dir: Path,
    output: Path,
    handler: Path | None = None,
    gate: bool = True,
    gate_rounds: int | None = None,
    progress: Callable[[str], None] | None = None,
    onnx: bool = True,
    serve_on: str = int8_target.DEFAULT_TARGET,
) -> list[str]:
    """Check the inputs, export to ONNX and run the precision gate, write the archive to a temporary file, check
    it, then move it. `handler`: a SageMaker PyTorch toolkit handler, shipped as code/inference.py. `serve_on`: the
    endpoint's instance type (or `this-cpu`), for which the int8 graph's weights are made."""
    check_model_dir(model_dir)
    if handler is not None and not handler.is_file():
        raise PackageError(f"--handler {handler}: no such file")
    if not output.name.endswith(".tar.gz"):
        raise PackageError(f"--output {output}: must end in .tar.gz (SageMaker expects a gzipped tar)")
    output.parent.mkdir(parents=True, exist_ok=True)
    model_files = [
        path
        for path in sorted(model_dir.iterdir())
        if path.is_file() and path.name not in (*SKIPPED_FILES, PRECISION_RECORD) and not path.name.startswith(".")
    ]
    handle, temporary = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(handle)
    scratch = tempfile.TemporaryDirectory(prefix="package-onnx-")
    try:
        onnx_dir = Path(scratch.name) / ONNX_DIR
        if gate and onnx:
            export_onnx(model_dir, onnx_dir, progress, serve_on)
        record = precision_record(model_dir, gate_rounds, progress, onnx_dir if gate and onnx else None,
                                  onnx=onnx) if gate else None
        with tarfile.open(temporary, "w:gz") as archive:
            for path in model_files:
                archive.add(path, arcname=path.name, filter=_normalise)
            for path in sorted(onnx_dir.glob("*")) if onnx_dir.is_dir() else []:
                archive.add(path, arcname=f"{ONNX_DIR}/{path.name}", filter=_normalise)
            if record is not None:
                _add_bytes(archive, PRECISION_RECORD, (json.dumps(record, indent=2) + "\n").encode())
            # The gate's held-out texts, for the accuracy check on the serving CPU (inference.sentiment.calibration)
            texts = json.dumps(held_out_texts(), ensure_ascii=False) + "\n"
            _add_bytes(archive, CALIBRATION_TEXTS, texts.encode())
            if handler is not None:
                archive.add(handler, arcname=TOOLKIT_HANDLER, filter=_normalise)
        names = verify_archive(Path(temporary), handler=handler is not None)
        shutil.move(temporary, output)
    finally:
        Path(temporary).unlink(missing_ok=True)
        scratch.cleanup()
    return names


def held_out_texts() -> list[str]:
    """The accuracy gate's held-out sample (training/data/sample: validation and test, never trained on)."""
    from inference.sentiment.accuracy_check import sample_texts

    return sample_texts()


def export_onnx(model_dir: Path, onnx_dir: Path, progress: Callable[[str], None] | None,
                serve_on: str = int8_target.DEFAULT_TARGET) -> dict:
    """The model's ONNX graphs (fp32, and int8 with the weights `serve_on`'s CPU needs) and export.json into
    `onnx_dir`; a failed export is recorded there and logged in one line, and the model serves on torch
    (`inference.sentiment.onnx_export`)."""
    from inference.sentiment import onnx_export

    return onnx_export.export(model_dir, onnx_dir, int8_target=int8_target.resolve(serve_on), progress=progress)


def precision_record(model_dir: Path, rounds: int | None, progress: Callable[[str], None] | None,
                     onnx_dir: Path | None = None, *, onnx: bool = True) -> dict:
    """The accuracy gate run on this model here: every (engine, precision) pair against torch fp32, the fastest
    that passes (`onnx_dir`: the graphs `export_onnx` wrote; `onnx=False`: torch's pairs only)."""
    from inference.sentiment import accuracy_check, precision

    options = {} if rounds is None else {"rounds": rounds}
    if not onnx:
        options["wanted"] = tuple(name for name in precision.PRECISIONS if name not in precision.ONNX_PRECISIONS)
    return accuracy_check.gate_record(model_dir, progress=progress, onnx_dir=onnx_dir, **options)


def read_archive_record(path: Path) -> dict | None:
    """The archive's precision.json, None without one (an archive from before the gate: served fp32)."""
    with tarfile.open(path, "r:gz") as archive:
        try:
            member = archive.getmember(PRECISION_RECORD)
        except KeyError:
            return None
        return json.loads(archive.extractfile(member).read())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model-dir", required=True, type=Path, help="output directory of a finished training")
    parser.add_argument("--output", required=True, type=Path, help="archive to write, e.g. model.tar.gz")
    parser.add_argument("--handler", type=Path, default=None,
                        help="a SageMaker PyTorch toolkit handler to ship as code/inference.py (the toolkit baseline "
                             "of make bench-handler; our server reads no code/)")
    parser.add_argument("--skip-gate", action="store_true",
                        help="no gate and no ONNX graphs (the endpoint then chooses among torch's pairs at start); the "
                             "export and the gate take about 30 s for RoBERTa-base on 2 vCPUs")
    parser.add_argument("--gate-rounds", type=int, help="timed rounds per precision in the gate (default: the gate's)")
    parser.add_argument("--skip-onnx", action="store_true",
                        help="no ONNX export: the gate measures torch's pairs only (the export takes about 17 s for "
                             "RoBERTa-base on 2 vCPUs)")
    parser.add_argument("--serve-on", default=int8_target.DEFAULT_TARGET, metavar="INSTANCE_TYPE",
                        help="the endpoint's SageMaker instance type, whose CPU decides the int8 graph's weights "
                             "(8-bit on Graviton and x86 with VNNI, 7-bit on other x86), or "
                             f"{int8_target.THIS_CPU} for a model served on this machine")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.gate_rounds is not None and args.gate_rounds < 1:
        parser.error(f"--gate-rounds {args.gate_rounds}: must be at least 1")
    try:
        int8_target.resolve(args.serve_on)
    except ValueError as error:
        parser.error(str(error))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a loading bar per gate step is noise in the packaging log
    try:
        names = build(
            args.model_dir,
            args.output,
            handler=args.handler,
            gate=not args.skip_gate,
            gate_rounds=args.gate_rounds,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            onnx=not args.skip_onnx,
            serve_on=args.serve_on,
        )
    except PackageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    size = args.output.stat().st_size / 2**20
    print(f"wrote {args.output} ({size:.1f} MiB, {len(names)} files)")
    record = read_archive_record(args.output)
    if record is None:
        print(f"no {PRECISION_RECORD} and no ONNX graphs (--skip-gate): the endpoint chooses among torch's pairs at "
              "start")
    else:
        from inference.sentiment.accuracy_check import report

        print("\n".join(report(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
