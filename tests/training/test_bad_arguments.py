"""Each bad argument stops the program with one clear `error:` line and exit status 2, no traceback."""

from __future__ import annotations

import json

import pytest

from tests.training.conftest import SAMPLE
from training import train_sentiment

VALIDATION = str(SAMPLE / "validation.jsonl")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def run(argv, capsys) -> tuple[int, str]:
    code = train_sentiment.main(argv)
    return code, capsys.readouterr().err


def assert_one_line(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("python -m training.train_sentiment: error: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def local(train: str, *extra: str, validation: str = VALIDATION) -> list[str]:
    return ["--model-name-or-path", "tiny", "--train-file", train, "--validation-file", validation, *extra]


def test_missing_file(tmp_path, capsys):
    code, err = run(local(str(tmp_path / "nope.jsonl")), capsys)
    assert code == 2
    assert_one_line(err, "--train-file", "nope.jsonl", "no such file")


def test_unsupported_file_type(tmp_path, capsys):
    path = tmp_path / "train.txt"
    path.write_text("hello\n")
    code, err = run(local(str(path)), capsys)
    assert code == 2
    assert_one_line(err, "--train-file", "'.txt'", ".csv, .json, .jsonl")


def test_validation_file_required_with_local_files(tmp_path, capsys):
    code, err = run(["--train-file", str(SAMPLE / "train.jsonl")], capsys)
    assert code == 2
    assert_one_line(err, "--validation-file is required")


def test_unknown_text_column(tmp_path, capsys):
    code, err = run(local(str(SAMPLE / "train.jsonl"), "--text-column", "tweet"), capsys)
    assert code == 2
    assert_one_line(err, "--text-column 'tweet' is not a column", "columns: text, label")


def test_file_without_label_column(tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": "fine", "sentiment": 1}])
    code, err = run(local(train), capsys)
    assert code == 2
    assert_one_line(err, "--label-column 'label' is not a column", "text, sentiment")


@pytest.mark.parametrize("label", [3, -1, "positive", 1.5, None])
def test_label_outside_the_three_classes(tmp_path, capsys, label):
    rows = [{"text": "good", "label": 2}, {"text": "bad", "label": label}]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    code, err = run(local(train), capsys)
    assert code == 2
    assert_one_line(err, "--train-file", "row 2", repr(label), "0..2", "0 negative, 1 neutral, 2 positive")


def test_bad_label_in_the_validation_csv(tmp_path, capsys):
    validation = tmp_path / "validation.csv"
    validation.write_text("text,label\nnice,2\nmeh,7\n")
    code, err = run(local(str(SAMPLE / "train.jsonl"), validation=str(validation)), capsys)
    assert code == 2
    assert_one_line(err, "--validation-file", "row 2", "'7'")


@pytest.mark.parametrize("content", ["", "text,label\n"])
def test_empty_data_set(tmp_path, capsys, content):
    path = tmp_path / "train.csv"
    path.write_text(content)
    code, err = run(local(str(path)), capsys)
    assert code == 2
    assert_one_line(err, "--train-file", "empty")


def test_empty_text(tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": "  ", "label": 1}])
    code, err = run(local(train), capsys)
    assert code == 2
    assert_one_line(err, "row 1 has no text")


def test_unparsable_json(tmp_path, capsys):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "ok", "label": 1}\n{not json\n')
    code, err = run(local(str(path)), capsys)
    assert code == 2
    assert_one_line(err, "--train-file", "cannot be parsed")


def test_hub_data_set_not_available_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["--model-name-or-path", "tiny", "--dataset-name", "no-such-org/no-such-set", "--cache-dir", str(tmp_path)]
    code, err = run([*argv, "--output-dir", str(tmp_path / "out")], capsys)
    assert code == 2
    assert_one_line(err, "--dataset-name no-such-org/no-such-set", "cannot be loaded")


def test_model_that_cannot_be_loaded(tmp_path, capsys):
    argv = ["--train-file", str(SAMPLE / "train.jsonl"), "--validation-file", VALIDATION]
    code, err = run([*argv, "--model-name-or-path", str(tmp_path / "missing-model")], capsys)
    assert code == 2
    assert_one_line(err, "--model-name-or-path", "missing-model", "cannot be loaded")


def test_resume_without_checkpoints(tmp_path, capsys):
    code, err = run(
        local(str(SAMPLE / "train.jsonl"), "--output-dir", str(tmp_path), "--resume-from-checkpoint", "last"), capsys
    )
    assert code == 2
    assert_one_line(err, "--resume-from-checkpoint last", "no checkpoint")


def test_resume_from_a_directory_that_is_no_checkpoint(tmp_path, capsys):
    code, err = run(local(str(SAMPLE / "train.jsonl"), "--resume-from-checkpoint", str(tmp_path)), capsys)
    assert code == 2
    assert_one_line(err, "not a Trainer checkpoint")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-length", "4", "between 8 and 512"),
        ("--max-length", "1024", "between 8 and 512"),
        ("--learning-rate", "0", "positive number"),
        ("--per-device-train-batch-size", "-2", "positive integer"),
        ("--dataloader-workers", "-1", "0 or more"),
    ],
)
def test_out_of_range_numbers_are_usage_errors(capsys, option, value, message):
    with pytest.raises(SystemExit) as exit_info:
        train_sentiment.main([option, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert option in err and message in err
    assert "Traceback" not in err
