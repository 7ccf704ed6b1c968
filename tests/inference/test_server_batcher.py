"""The batcher alone: requests gathered into batches, answers to their own callers, failures kept to their owner,
a bounded queue that refuses at once. No torch, no HTTP: `run_batch` is a plain function here.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from inference.sentiment.server.batcher import Batcher, DeadlineExceeded, Overloaded, Stopped

# Also run by tests/inference/test_python313.py under CPython 3.13, the image's Python.
pytestmark = pytest.mark.py313


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
        with pytest.raises(Overloaded, match=r"3 texts \(3 tokens\) already wait"):
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


# --- one queue for every replica, token budgets, deadlines, cancelling (issue 32) ---------------------------------

def test_batches_and_the_queue_are_bounded_by_tokens_too():
    gate = threading.Event()
    recorder = Recorder(gate)
    batcher = Batcher(recorder, max_batch_size=100, max_batch_tokens=10, max_wait_s=0, max_queue=100,
                      max_queue_tokens=12).start()
    try:
        held = batcher.submit("held", 1, tokens=5)
        while not recorder.batches:
            time.sleep(0.001)
        # 4 + 5 tokens fit one pass of 10; the next 3 do not join it.
        futures = [batcher.submit(name, 1, tokens=tokens) for name, tokens in (("a", 4), ("b", 5), ("c", 3))]
        with pytest.raises(Overloaded, match=r"\(12 tokens\) already wait \(at most 100 texts, 12 tokens\)"):
            batcher.submit("refused", 1, tokens=1)  # one text, but the queue's tokens are spent
        gate.set()
        held.result(10)
        assert [future.result(10).result for future in futures] == ["A", "B", "C"]
        assert recorder.batches[1:] == [["a", "b"], ["c"]]
        assert batcher.queued_tokens == 0 and batcher.stats.tokens == 5 + 12
    finally:
        batcher.stop(5)


def test_every_replica_takes_from_the_one_queue_so_none_idles_while_another_is_busy():
    release = threading.Event()
    seen = []

    def run_batch(items):
        seen.append((threading.current_thread().name, list(items)))
        if "slow" in items:
            release.wait(10)
        return [item.upper() for item in items]

    batcher = Batcher(run_batch, replicas=2, max_batch_size=1, max_wait_s=0, max_queue=100, name="r").start()
    try:
        slow = batcher.submit("slow", 1)
        while not seen:
            time.sleep(0.001)
        # One replica is held by "slow"; the other answers everything behind it meanwhile.
        assert [batcher.submit(name, 1).result(10).result for name in ("x", "y", "z")] == ["X", "Y", "Z"]
        assert not slow.done()
        release.set()
        assert slow.result(10).result == "SLOW"
        threads = {name for name, items in seen if items != ["slow"]}
        assert len(threads) == 1 and threads != {seen[0][0]}
    finally:
        release.set()
        batcher.stop(5)


def test_work_past_its_deadline_is_dropped_before_it_runs():
    gate = threading.Event()
    recorder = Recorder(gate)
    batcher = Batcher(recorder, max_batch_size=8, max_wait_s=0, max_queue=100).start()
    try:
        held = batcher.submit("held", 1)
        while not recorder.batches:
            time.sleep(0.001)
        late = batcher.submit("late", 1, deadline=time.monotonic() + 0.05)
        kept = batcher.submit("kept", 1, deadline=time.monotonic() + 60)
        time.sleep(0.1)  # "late" expires while the pass ahead of it runs
        gate.set()
        held.result(10)
        with pytest.raises(DeadlineExceeded, match="past its deadline"):
            late.result(10)
        assert kept.result(10).result == "KEPT"
        assert ["late"] not in recorder.batches and all("late" not in batch for batch in recorder.batches)
        assert batcher.stats.expired == 1
    finally:
        batcher.stop(5)


def test_a_cancelled_request_leaves_the_queue_and_frees_its_budget():
    gate = threading.Event()
    recorder = Recorder(gate)
    batcher = Batcher(recorder, max_batch_size=8, max_wait_s=0, max_queue=2).start()
    try:
        held = batcher.submit("held", 1)
        while not recorder.batches:
            time.sleep(0.001)
        gone = batcher.submit("gone", 2)
        with pytest.raises(Overloaded):
            batcher.submit("refused", 1)
        assert batcher.cancel(gone) and gone.cancelled()
        after = batcher.submit("after", 1)  # the cancelled request's room is free again
        gate.set()
        held.result(10)
        assert after.result(10).result == "AFTER"
        assert all("gone" not in batch for batch in recorder.batches) and batcher.stats.cancelled == 1
    finally:
        batcher.stop(5)


def test_a_stuck_replica_is_replaced_and_health_fails_only_while_none_can_answer():
    stuck = threading.Event()
    release = threading.Event()

    def run_batch(items):
        if "hang" in items:
            stuck.set()
            release.wait(10)
        return [item.upper() for item in items]

    restarted = threading.Event()

    def restart(index):
        restarted.set()
        return run_batch

    batcher = Batcher(run_batch, restart=restart, max_batch_size=1, max_wait_s=0, max_queue=100,
                      stuck_after_s=0.2, check_every_s=3600)  # checked by hand below
    batcher.start()
    try:
        assert batcher.health().healthy
        batcher.submit("hang", 1)
        assert stuck.wait(5)
        time.sleep(0.3)
        health = batcher.health()
        assert not health.healthy and "replica 0 stuck" in health.detail
        batcher.check()  # the watchdog's round: retire the stuck one, start its replacement
        assert restarted.wait(5)
        deadline = time.monotonic() + 5
        while not batcher.health().healthy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert batcher.health().healthy
        assert batcher.submit("next", 1).result(5).result == "NEXT"  # answered by the replacement
        assert batcher.stats.restarts == 1
    finally:
        release.set()
        batcher.stop(5)


def test_a_failing_restart_is_retried_with_backoff_and_the_other_replicas_keep_serving():
    """A replica's thread dies; its restarts fail twice, 0.1 s then 0.2 s apart, then succeed. The other replica
    answers every request meanwhile, and /ping's health stays true."""
    attempts: list[float] = []

    died: list[str] = []

    def run_batch(items):
        if "die" in items and not died:
            died.append(threading.current_thread().name)
            raise SystemExit  # not a request's failure: the replica's thread ends
        return [item.upper() for item in items]

    def restart(index):
        attempts.append(time.monotonic())
        if len(attempts) <= 2:
            raise RuntimeError(f"cannot load replica {index} (attempt {len(attempts)})")
        return run_batch

    batcher = Batcher(run_batch, restart=restart, replicas=2, max_batch_size=1, max_wait_s=0, max_queue=100,
                      backoff_s=0.1, check_every_s=0.01, name="r")
    batcher.start()
    try:
        killer = batcher.submit("die", 1)
        answered = []
        deadline = time.monotonic() + 10
        while len(attempts) < 3 and time.monotonic() < deadline:
            answered.append(batcher.submit("ok", 1).result(5).result)
            assert batcher.health().healthy
        assert len(attempts) == 3 and answered and set(answered) == {"OK"}
        gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
        assert 0.09 <= gaps[0] < gaps[1] and gaps[1] >= 0.19  # 0.1 s, then 0.2 s
        assert batcher.stats.failed_restarts == 2
        while batcher.stats.restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert batcher.stats.restarts == 1 and batcher.health().detail == "2 of 2 replicas serving"
        with pytest.raises(RuntimeError, match=r"replica [01] failed: SystemExit"):
            killer.result(0)  # its request was answered when the replica died, not left to its deadline
    finally:
        batcher.stop(5)
