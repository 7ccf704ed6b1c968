"""The batcher alone: requests gathered into batches, answers to their own callers, failures kept to their owner,
a bounded queue that refuses at once. No torch, no HTTP: `run_batch` is a plain function here.
"""

from __future__ import annotations

import threading
import time

import pytest

from inference.sentiment.server.batcher import Batcher, Overloaded, Stopped


class Recorder:
    """run_batch that answers each item with its upper-case self and records every batch it was given."""

    def __init__(self, gate: threading.Event | None = None, poison: str | None = None):
        self.batches: list[list[str]] = []
        self.gate = gate
        self.poison = poison

    def __call__(self, items):
        self.batches.append(list(items))
        if self.gate is not None:
            self.gate.wait(10)
        if self.poison is not None and self.poison in items:
            raise RuntimeError("this item breaks the whole pass")
        return [item.upper() for item in items]


def test_requests_queued_while_a_pass_runs_form_the_next_batch_and_answers_go_to_their_callers():
    gate = threading.Event()
    recorder = Recorder(gate)
    batcher = Batcher(recorder, max_batch_size=8, max_wait_s=0, max_queue=100).start()
    try:
        first = batcher.submit("first", 1)
        while not recorder.batches:  # the first pass is running (held by the gate)
            time.sleep(0.001)
        later = {name: batcher.submit(name, 1) for name in ("a", "b", "c", "d")}
        gate.set()
        assert first.result(10).result == "FIRST" and first.result(10).batch_texts == 1
        for name, future in later.items():
            outcome = future.result(10)
            assert outcome.result == name.upper()
            assert outcome.batch_texts == 4
        assert recorder.batches == [["first"], ["a", "b", "c", "d"]]
    finally:
        batcher.stop(5)


def test_the_first_request_waits_up_to_max_wait_for_company():
    recorder = Recorder()
    batcher = Batcher(recorder, max_batch_size=3, max_wait_s=5, max_queue=100).start()
    try:
        futures = [batcher.submit(name, 1) for name in ("x", "y", "z")]  # the third fills the batch: no 5 s wait
        assert [future.result(4).result for future in futures] == ["X", "Y", "Z"]
        assert recorder.batches == [["x", "y", "z"]]
    finally:
        batcher.stop(5)


def test_batches_hold_at_most_max_batch_size_texts_and_a_larger_request_runs_alone():
    gate = threading.Event()
    recorder = Recorder(gate)
    batcher = Batcher(recorder, max_batch_size=4, max_wait_s=0, max_queue=100).start()
    try:
        held = batcher.submit("held", 1)
        while not recorder.batches:
            time.sleep(0.001)
        sizes = {"two": 2, "three": 3, "big": 9, "one": 1}
        futures = {name: batcher.submit(name, size) for name, size in sizes.items()}
        gate.set()
        held.result(10)
        assert {name: future.result(10).result for name, future in futures.items()} == {
            name: name.upper() for name in sizes}
        # In arrival order: "two" (2) cannot take "three" (2+3 > 4); "big" alone; then "one".
        assert recorder.batches[1:] == [["two"], ["three"], ["big"], ["one"]]
    finally:
        batcher.stop(5)


def test_a_request_that_breaks_the_pass_fails_alone_and_its_neighbours_get_their_answers():
    gate = threading.Event()
    recorder = Recorder(gate, poison="bad")
    batcher = Batcher(recorder, max_batch_size=8, max_wait_s=0, max_queue=100).start()
    try:
        held = batcher.submit("held", 1)
        while not recorder.batches:
            time.sleep(0.001)
        futures = {name: batcher.submit(name, 1) for name in ("left", "bad", "right")}
        gate.set()
        held.result(10)
        assert futures["left"].result(10).result == "LEFT"
        assert futures["right"].result(10).result == "RIGHT"
        with pytest.raises(RuntimeError, match="breaks the whole pass"):
            futures["bad"].result(10)
        assert ["left", "bad", "right"] in recorder.batches  # they were batched, then retried one by one
        assert batcher.stats.retried_alone == 3
    finally:
        batcher.stop(5)


def test_a_full_queue_refuses_at_once_and_admits_again_once_drained():
    gate = threading.Event()
    recorder = Recorder(gate)
    batcher = Batcher(recorder, max_batch_size=2, max_wait_s=0, max_queue=3).start()
    try:
        running = batcher.submit("running", 1)
        while not recorder.batches:
            time.sleep(0.001)
        queued = [batcher.submit("q1", 2), batcher.submit("q2", 1)]  # 3 texts wait: the queue is full
        with pytest.raises(Overloaded, match="3 texts already wait"):
            batcher.submit("refused", 1)
        assert batcher.stats.rejected == 1 and batcher.queued_texts == 3
        gate.set()
        running.result(10)
        assert [future.result(10).result for future in queued] == ["Q1", "Q2"]
        assert batcher.submit("later", 1).result(10).result == "LATER"
        assert batcher.queued_texts == 0
    finally:
        batcher.stop(5)


def test_a_request_larger_than_the_queue_is_admitted_into_an_empty_queue():
    batcher = Batcher(Recorder(), max_batch_size=4, max_wait_s=0, max_queue=2).start()
    try:
        assert batcher.submit("large", 5).result(10).result == "LARGE"
    finally:
        batcher.stop(5)


def test_stop_answers_what_is_queued_then_refuses():
    gate = threading.Event()
    recorder = Recorder(gate)
    batcher = Batcher(recorder, max_batch_size=1, max_wait_s=0, max_queue=10).start()
    first = batcher.submit("first", 1)
    while not recorder.batches:
        time.sleep(0.001)
    queued = batcher.submit("queued", 1)
    stopper = threading.Thread(target=batcher.stop, args=(10,))
    stopper.start()
    gate.set()
    stopper.join(10)
    assert first.result(1).result == "FIRST" and queued.result(1).result == "QUEUED"
    with pytest.raises(Stopped):
        batcher.submit("too late", 1)


@pytest.mark.parametrize("kwargs", [{"max_batch_size": 0}, {"max_queue": 0}, {"max_wait_s": -1}])
def test_bad_limits_are_refused(kwargs):
    settings = {"max_batch_size": 4, "max_wait_s": 0, "max_queue": 4, **kwargs}
    with pytest.raises(ValueError, match="at least"):
        Batcher(Recorder(), **settings)
