"""DJL's error record after a started stream, in every form DJL's own code writes it, cut at random chunk boundaries.

Read at github.com/deepjavalibrary/djl-serving and github.com/deepjavalibrary/djl:
- LMI 0.23 (branch 0.23.0-dlc, 07673c54097d8a51bf6e526d3268b7d19e8b5425): `engines/python/src/main/java/ai/djl/
  python/engine/RollingBatch.java` run appends `JsonUtils.GSON.toJson(new Output(code, "Batch inference failed"))`
  with `req.data.appendContent(err, true)` after the chunks already sent; the code is 424 for an engine failure
  (`engines/python/setup/djl_python/huggingface.py` reads the emptied result, `djl_python_engine.py` answers
  `Output().error`). The text before it comes from `engines/python/setup/djl_python/rolling_batch/rolling_batch.py`
  `_jsonlines_output_formatter` (JSON lines) or `_json_output_formatter` (raw text of one JSON document).
- djl `api/src/main/java/ai/djl/util/JsonUtils.java`: at v0.23.0 (bae9212b61a550a0f0259dc77081086afab8d74e) GSON is
  compact; from v0.24.0 (d7c8a74431769245ca7c2ecad6e2e98205aac72a, and v0.34.0-v0.36.0 as 0.33+ build with) GSON
  pretty-prints when DJL_PRETTY_PRINT=true, so 0.33+'s `AsyncRequestManager.java` record spans lines.
The bytes are built by tests/fake_lmi.py from those rules (`gson`, `engine_failure`, `lmi_dist_*`, `vllm_line`).
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.llm import loadtest
from inference.llm.stream import read_stream
from tests import fake_lmi
from tests.fake_lmi import FakeLmi

VLLM_VERSIONS = ("0.33.0", "0.35.0", "0.36.0-lmi27")


def lmi_dist_jsonlines(count: int) -> bytes:
    return b"".join(fake_lmi.lmi_dist_jsonlines(fake_lmi.token(n)[1]) for n in range(1, count + 1))


def lmi_dist_json(count: int) -> bytes:
    """0.23's json formatter cut short: the document's start and pieces, never its closing `"}`."""
    return b"".join(fake_lmi.lmi_dist_json_piece(fake_lmi.token(n)[1], n == 1, False) for n in range(1, count + 1))


def vllm_lines(count: int) -> bytes:
    history: list[str] = []
    return b"".join(fake_lmi.vllm_line([fake_lmi.token(n)], history, False) for n in range(1, count + 1))


# What DJL's source sends: (text already sent, record appended, the message the reader must give).
DJL_FORMS = {
    "0.23 jsonlines": (lmi_dist_jsonlines(5), fake_lmi.engine_failure("0.23.0"), "Batch inference failed (code 424)"),
    "0.23 json": (lmi_dist_json(5), fake_lmi.engine_failure("0.23.0"), "Batch inference failed (code 424)"),
    **{f"{version} pretty": (vllm_lines(5), fake_lmi.engine_failure(version, pretty=True),
                             "Inference Engine Failure (code 500)") for version in VLLM_VERSIONS},
}


def cut(data: bytes, cuts: list[int]) -> list[tuple[float, bytes]]:
    points = sorted({point % (len(data) + 1) for point in cuts} | {0, len(data)})
    return [(0.01 * number, data[start:end]) for number, (start, end) in enumerate(itertools.pairwise(points), 1)]


def test_the_records_are_what_djls_gson_writes():
    compact = fake_lmi.engine_failure("0.23.0")
    assert compact == (b'{"code":424,"message":"Batch inference failed","properties":{},'
                       b'"content":{"keys":[],"values":[]}}')
    pretty = fake_lmi.engine_failure("0.36.0-lmi27", pretty=True)
    assert pretty.startswith(b'{\n  "code": 500,\n  "message": "Inference Engine Failure",\n') and b"\n" in pretty
    with pytest.raises(ValueError, match=r"v0\.24"):
        fake_lmi.engine_failure("0.23.0", pretty=True)
    assert fake_lmi.gson({"m": "a<b"}) == b'{"m":"a\\u003cb"}'  # Gson escapes HTML characters by default


@pytest.mark.parametrize("form", DJL_FORMS)
@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_a_record_after_a_started_stream_is_a_server_error_with_djls_code_and_message(form, cuts):
    sent, record, message = DJL_FORMS[form]
    answer = read_stream(cut(sent + record, cuts))
    assert answer.error == message
    if not form.startswith("0.23 json"):  # JSON lines: the text before the failure is still read, and timed
        assert answer.text == fake_lmi.generated(5)


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12), pretty=st.booleans(),
       lines=st.booleans())
def test_either_record_form_after_either_kind_of_text_is_read(cuts, pretty, lines):
    """The reader does not depend on which combination a release writes: compact or pretty after lines or text."""
    record = fake_lmi.engine_failure("0.35.0", pretty=pretty)
    answer = read_stream(cut((lmi_dist_jsonlines(3) if lines else lmi_dist_json(3)) + record, cuts))
    assert answer.error == "Inference Engine Failure (code 500)"


def test_text_that_merely_looks_like_a_record_is_not_one():
    """0.23's json formatter escapes quotes in the text, so a token `{"code": 1}` cannot pass for DJL's record."""
    data = fake_lmi.lmi_dist_json_piece('{"code": 500, "message": "x"}', True, True)
    answer = read_stream([(0.1, data)])
    assert answer.error is None and answer.final_text == '{"code": 500, "message": "x"}'
    broken = read_stream([(0.1, lmi_dist_jsonlines(2) + b"garbage\n")])
    assert broken.error == "not a JSON line: garbage"


@pytest.mark.servers
@pytest.mark.parametrize(("version", "formatter", "pretty", "message"), [
    ("0.23.0", "jsonlines", False, "Batch inference failed (code 424)"),
    ("0.23.0", "json", False, "Batch inference failed (code 424)"),
    ("0.36.0-lmi27", "json", True, "Inference Engine Failure (code 500)"),
])
def test_the_load_test_counts_it_as_a_server_error_with_djls_message(version, formatter, pretty, message):
    with FakeLmi("rolling", version=version, output_formatter=formatter, djl_pretty_print=pretty,
                 token_s=0.0005) as server:
        server.fail_streams(1, after=3)
        target = loadtest.HttpTarget(server.url, timeout=10, stream=True)
        workload = loadtest.llm_workload(8, 6, loadtest.WordCounter(), stream=True)
        step = loadtest.run_step(target, workload, concurrency=1, requests=3, warmup=0)
    assert step["errors"]["5xx"] == 1 and step["errors"]["other"] == 0 and step["ok"] == 2
    assert step["error_examples"]["5xx"] == f"error in the answer: {message}"


def test_random_cut_helper_keeps_every_byte():
    data = lmi_dist_jsonlines(4) + fake_lmi.engine_failure("0.23.0")
    pieces = cut(data, [random.Random(1).randint(0, 500) for _ in range(9)])
    assert b"".join(piece for _, piece in pieces) == data
