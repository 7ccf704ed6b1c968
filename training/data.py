"""Load and check the labelled text the trainer consumes: a hub dataset or local CSV/JSON(L) files.

Every problem a user can cause (missing file, wrong column, bad labels, empty split) becomes a
`DataError` whose message names the argument and the value, so the CLI can print one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from training import LABELS

SPLITS = ("train", "validation", "test")
LOCAL_SUFFIXES = (".csv", ".json", ".jsonl")
SAMPLE_DIR = Path(__file__).parent / "data" / "sample"


class DataError(ValueError):
    """A data set or data argument that cannot be used; the message is meant for the user."""


@dataclass(frozen=True)
class DataSource:
    """Where the splits come from: local files when `train_file` is set, else the hub."""

    dataset_name: str = "cardiffnlp/tweet_eval"
    dataset_config: str | None = "sentiment"
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    cache_dir: str | None = None

    @property
    def local(self) -> bool:
        return any((self.train_file, self.validation_file, self.test_file))

    def files(self) -> dict[str, str | None]:
        return {"train": self.train_file, "validation": self.validation_file, "test": self.test_file}


def sample_source() -> DataSource:
    """The small labelled sample shipped in the repository (train/validation/test JSONL)."""
    return DataSource(
        train_file=str(SAMPLE_DIR / "train.jsonl"),
        validation_file=str(SAMPLE_DIR / "validation.jsonl"),
        test_file=str(SAMPLE_DIR / "test.jsonl"),
    )


def _option(split: str) -> str:
    return f"--{split}-file"


def check_files(source: DataSource) -> None:
    """Fail fast on file arguments before any heavy import or download happens."""
    if not source.local:
        return
    files = source.files()
    for split in ("train", "validation"):
        if not files[split]:
            raise DataError(
                f"{_option(split)} is required when local files are used "
                "(give --train-file and --validation-file, optionally --test-file)"
            )
    for split, name in files.items():
        if name is None:
            continue
        path = Path(name)
        if path.suffix.lower() not in LOCAL_SUFFIXES:
            raise DataError(
                f"{_option(split)} {name}: unsupported file type {path.suffix or '(none)'!r}; "
                f"use one of {', '.join(LOCAL_SUFFIXES)}"
            )
        if not path.is_file():
            raise DataError(f"{_option(split)} {name}: no such file")


def _read_local(split: str, name: str) -> list[dict]:
    """Rows of a CSV, JSON-lines or JSON-array file as dicts, keeping values as written."""
    import pandas as pd

    path = Path(name)
    try:
        if path.suffix.lower() == ".csv":
            frame = pd.read_csv(path, keep_default_na=False, dtype=str)
            return frame.to_dict(orient="records")
        text = path.read_text(encoding="utf-8")
        stripped = text.lstrip()
        if stripped.startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except pd.errors.EmptyDataError:  # a CSV with not even a header line
        return []
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f"{_option(split)} {name}: cannot be parsed ({error})") from error
    if not all(isinstance(row, dict) for row in rows):
        raise DataError(f"{_option(split)} {name}: every record must be a JSON object")
    return rows


def _as_label(value: object) -> int | None:
    """The integer class of a cell, accepting 2, 2.0 and "2"; None when it is not an integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def validate_rows(rows: list[dict], where: str, text_column: str, label_column: str) -> dict[str, list]:
    """Columns `text` and `label` (plain lists) from rows, or a DataError saying what is wrong."""
    if not rows:
        raise DataError(f"{where}: the data set is empty (no rows)")
    columns = list(rows[0].keys())
    for option, column in (("--text-column", text_column), ("--label-column", label_column)):
        if column not in columns:
            raise DataError(
                f"{where}: {option} {column!r} is not a column of the data "
                f"(columns: {', '.join(map(str, columns)) or 'none'})"
            )
    texts: list[str] = []
    labels: list[int] = []
    allowed = ", ".join(f"{index} {name}" for index, name in enumerate(LABELS))
    for number, row in enumerate(rows, start=1):
        text = row.get(text_column)
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: row {number} has no text in column {text_column!r}")
        raw = row.get(label_column)
        label = _as_label(raw)
        if label is None or not 0 <= label < len(LABELS):
            raise DataError(
                f"{where}: row {number} has label {raw!r} in column {label_column!r}; "
                f"labels must be integers 0..{len(LABELS) - 1} ({allowed})"
            )
        texts.append(text)
        labels.append(label)
    return {"text": texts, "label": labels}


def _load_hub(source: DataSource) -> dict[str, list[dict]]:
    try:
        import datasets

        loaded = datasets.load_dataset(source.dataset_name, source.dataset_config, cache_dir=source.cache_dir)
    except Exception as error:  # the hub client raises many types; the user needs the reason only
        raise DataError(
            f"--dataset-name {source.dataset_name} (config {source.dataset_config}): cannot be loaded "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no detail'})"
        ) from error
    missing = [split for split in ("train", "validation") if split not in loaded]
    if missing:
        raise DataError(
            f"--dataset-name {source.dataset_name}: split(s) {', '.join(missing)} missing "
            f"(has: {', '.join(loaded.keys())})"
        )
    return {split: loaded[split].to_list() for split in SPLITS if split in loaded}


def load_splits(source: DataSource) -> dict[str, dict[str, list]]:
    """Validated splits as {"train": {"text": [...], "label": [...]}, ...}; test may be absent."""
    check_files(source)
    if source.local:
        raw = {split: _read_local(split, name) for split, name in source.files().items() if name}
        where = {split: f"{_option(split)} {name}" for split, name in source.files().items() if name}
    else:
        raw = _load_hub(source)
        where = {split: f"--dataset-name {source.dataset_name} split {split}" for split in raw}
    return {
        split: validate_rows(rows, where[split], source.text_column, source.label_column) for split, rows in raw.items()
    }
