"""One admission queue feeding every model replica: batches formed by a token budget, refusals at once, deadlines,
and replicas that are watched and restarted.

Requests come from the event loop (`submit`), each with its texts' token count and a deadline. Every replica (an
inference thread of its own; they share the model's weights, torch releases the GIL inside its ops) takes the
next batch from the same queue, so no replica idles while another has work, and a refusal means the whole
server is full, not one worker of it. A replica that finds the queue empty waits for the first request, then up
to `max_wait_s` for more, and takes requests in arrival order while they fit in `max_batch_size` texts and
`max_batch_tokens` tokens (a request larger than that runs alone; requests are never split, so each answer is
whole). While replicas compute, new requests queue up and form the next batches without waiting.

- Bounded: the queue holds at most `max_queue` texts and `max_queue_tokens` tokens. A request that would go
  beyond either raises `Overloaded` at once (the server answers 429), so memory and waiting stay bounded. An
  empty queue always admits, so one request larger than the budget is not refused forever.
- Deadlines: a request whose deadline passed while it waited is dropped before it runs (`DeadlineExceeded`);
  `cancel` takes a request out of the queue (its client went away, or stopped waiting).
- Failures stay with their owner: if a batch's forward pass raises, each of its requests runs again alone, and
  only one that fails alone gets the error.
- Supervision: a replica whose thread ended, or whose forward pass has run longer than `stuck_after_s`, is
  retired (if a stuck one ever returns, it stops) and replaced through `restart(index)`, which returns the new
  replica's `run_batch` or raises. A failed restart is retried after 1, 2, 4 ... seconds (at most
  `backoff_cap_s`), in a thread of its own: the other replicas keep serving meanwhile. `health()` says whether
  any replica can still answer (what /ping reports).

Nothing here knows about HTTP or torch: `run_batch(items) -> results` does the work.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

LOG = logging.getLogger(__name__)
RunBatch = Callable[[Sequence[Any]], Sequence[Any]]


class Overloaded(Exception):
    """The queue is full: answer 429 now rather than make the caller wait behind it."""


class Stopped(Exception):
    """The server is stopping and takes no new work."""


class DeadlineExceeded(Exception):
    """The request's deadline passed before its forward pass began; it was dropped unrun."""


@dataclass(eq=False)
class _Pending:
    item: Any
    size: int  # texts
    tokens: int
    future: Future
    queued_at: float
    deadline: float


@dataclass
class BatchStats:
    """Counters the server reports (and tests read)."""

    batches: int = 0
    requests: int = 0
    texts: int = 0
    tokens: int = 0
    rejected: int = 0
    expired: int = 0
    cancelled: int = 0
    retried_alone: int = 0
    restarts: int = 0
    failed_restarts: int = 0
    largest_batch_texts: int = 0
    sizes: collections.Counter = field(default_factory=collections.Counter)  # texts per batch -> batches


@dataclass(frozen=True)
class Outcome:
    """A request's answer, with how many texts shared its forward pass."""

    result: Any
    batch_texts: int


@dataclass(frozen=True)
class Health:
    healthy: bool
    detail: str


@dataclass(eq=False)
class _Replica:
    """One inference thread; `retired` tells it to stop after its current batch."""

    index: int
    run_batch: RunBatch
    thread: threading.Thread | None = None
    busy_since: float | None = None
    retired: bool = False


@dataclass(eq=False)
class _Slot:
    """A replica's place: serving, or waiting for / running a restart attempt."""

    index: int
    replica: _Replica | None = None
    state: str = "serving"  # serving | waiting | restarting
    failures: int = 0  # consecutive failed restart attempts
    next_attempt: float = 0.0
    reason: str = ""


def _settle(future: Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve a future unless its caller already gave up on it (cancelled, or answered by a deadline)."""
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


class Batcher:
    """The admission queue and its replicas; `run_batch` gets a list of items and returns one result each."""

    def __init__(self, run_batch: RunBatch, *, max_batch_size: int, max_wait_s: float, max_queue: int,
                 max_batch_tokens: int | None = None, max_queue_tokens: int | None = None, replicas: int = 1,
                 restart: Callable[[int], RunBatch] | None = None, stuck_after_s: float | None = None,
                 timeout_s: float | None = None, backoff_s: float = 1.0, backoff_cap_s: float = 30.0,
                 check_every_s: float = 0.1, name: str = "inference"):
        if max_batch_size < 1 or max_queue < 1 or max_wait_s < 0 or replicas < 1:
            raise ValueError("max_batch_size, max_queue and replicas must be at least 1, max_wait_s at least 0")
        if (max_batch_tokens is not None and max_batch_tokens < 1) or (
                max_queue_tokens is not None and max_queue_tokens < 1):
            raise ValueError("max_batch_tokens and max_queue_tokens must be at least 1")
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.max_queue_tokens = max_queue_tokens
        self.timeout_s = timeout_s  # default deadline of a request submitted without one
        self.stuck_after_s = stuck_after_s
        self.backoff_s, self.backoff_cap_s, self.check_every_s = backoff_s, backoff_cap_s, check_every_s
        self.name = name
        self.stats = BatchStats()
        self._restart = restart or (lambda index: run_batch)
        self._queue: collections.deque[_Pending] = collections.deque()
        self._queued_texts = 0
        self._queued_tokens = 0
        self._condition = threading.Condition()
        self._stopping = False
        self._stopped = threading.Event()
        self._slots = [_Slot(index, _Replica(index, run_batch)) for index in range(replicas)]
        self._watchdog = threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True)

    # --- the queue ---------------------------------------------------------------------------------------------

    @property
    def queued_texts(self) -> int:
        return self._queued_texts

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    def start(self) -> Batcher:
        for slot in self._slots:
            self._launch(slot.replica)
        self._watchdog.start()
        return self

    def submit(self, item: Any, size: int, tokens: int | None = None, deadline: float | None = None) -> Future:
        """Queue one request of `size` texts and `tokens` tokens (default: one per text), to start before the
        monotonic `deadline`; its Future resolves to an `Outcome` or raises the request's error."""
        if size < 1:
            raise ValueError("a request has at least one text")
        tokens = size if tokens is None else tokens
        now = time.monotonic()
        if deadline is None:
            deadline = now + self.timeout_s if self.timeout_s is not None else float("inf")
        future: Future = Future()
        with self._condition:
            if self._stopping:
                raise Stopped("the server is stopping")
            if self._queue and (self._queued_texts + size > self.max_queue or (
                    self.max_queue_tokens is not None and self._queued_tokens + tokens > self.max_queue_tokens)):
                self.stats.rejected += 1
                budget = f"{self.max_queue} texts" + (f", {self.max_queue_tokens} tokens"
                                                      if self.max_queue_tokens is not None else "")
                raise Overloaded(f"{self._queued_texts} texts ({self._queued_tokens} tokens) already wait "
                                 f"(at most {budget})")
            self._queue.append(_Pending(item, size, tokens, future, now, deadline))
            self._queued_texts += size
            self._queued_tokens += tokens
            self._condition.notify()
        return future

    async def run(self, item: Any, size: int, tokens: int | None = None, deadline: float | None = None) -> Outcome:
        """`submit` for the event loop: waits for the answer without blocking the loop."""
        return await asyncio.wrap_future(self.submit(item, size, tokens, deadline))

    def cancel(self, future: Future, *, expired: bool = False) -> bool:
        """Take a request out of the queue (its client left, or its deadline passed: `expired`); False if it
        already started."""
        with self._condition:
            for pending in self._queue:
                if pending.future is future:
                    self._queue.remove(pending)
                    self._queued_texts -= pending.size
                    self._queued_tokens -= pending.tokens
                    if expired:
                        self.stats.expired += 1
                    else:
                        self.stats.cancelled += 1
                    future.cancel()
                    return True
        return False

    def stop(self, timeout: float | None = None) -> None:
        """Answer everything already queued (dropping what expired), then end the replicas."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        self._stopped.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        for slot in self._slots:
            replica = slot.replica
            if replica is not None and replica.thread is not None and replica.thread.is_alive():
                replica.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def fail_queued(self, error: BaseException) -> int:
        """Answer every queued request with `error` (the drain's time is up); returns how many."""
        with self._condition:
            pending, self._queue = list(self._queue), collections.deque()
            self._queued_texts = self._queued_tokens = 0
        for item in pending:
            _settle(item.future, error=error)
        return len(pending)

    def _take(self, replica: _Replica) -> list[_Pending] | None:
        """The next batch for `replica`: wait for a first request, then up to max_wait_s for more; None once the
        server stops with nothing queued, or the replica was retired."""
        with self._condition:
            while True:
                while not self._queue:
                    if self._stopping or replica.retired:
                        return None
                    self._condition.wait()
                if replica.retired:
                    return None
                deadline = time.monotonic() + self.max_wait_s
                while self._queue and not self._full() and not self._stopping:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._condition.wait(remaining)
                batch = self._pop_batch()
                if batch:
                    return batch
                # Everything waiting had expired, or another replica took it: wait again.

    def _full(self) -> bool:
        return self._queued_texts >= self.max_batch_size or (
            self.max_batch_tokens is not None and self._queued_tokens >= self.max_batch_tokens)

    def _pop_batch(self) -> list[_Pending]:
        """Requests from the front while they fit; expired ones are dropped on the way (caller holds the lock)."""
        batch: list[_Pending] = []
        texts = tokens = 0
        now = time.monotonic()
        while self._queue:
            pending = self._queue[0]
            if pending.deadline <= now or pending.future.cancelled():
                self._queue.popleft()
                self._queued_texts -= pending.size
                self._queued_tokens -= pending.tokens
                if not pending.future.cancelled():
                    self.stats.expired += 1
                    _settle(pending.future, error=DeadlineExceeded(
                        f"waited {now - pending.queued_at:.1f} s in the queue, past its deadline"))
                continue
            if batch and (texts + pending.size > self.max_batch_size or (
                    self.max_batch_tokens is not None and tokens + pending.tokens > self.max_batch_tokens)):
                break
            self._queue.popleft()
            self._queued_texts -= pending.size
            self._queued_tokens -= pending.tokens
            batch.append(pending)
            texts += pending.size
            tokens += pending.tokens
        return batch

    # --- replicas ----------------------------------------------------------------------------------------------

    def _launch(self, replica: _Replica) -> None:
        replica.thread = threading.Thread(target=self._serve, args=(replica,), name=f"{self.name}-{replica.index}",
                                          daemon=True)
        replica.thread.start()

    def _serve(self, replica: _Replica) -> None:
        live: list[_Pending] = []
        try:
            while not replica.retired and (batch := self._take(replica)) is not None:
                live = [pending for pending in batch if pending.future.set_running_or_notify_cancel()]
                if live:
                    replica.busy_since = time.monotonic()
                    try:
                        self._process(live, replica.run_batch)
                    finally:
                        replica.busy_since = None
                live = []
        except BaseException as error:  # a bug, not a request's failure (those are answered in _process)
            LOG.exception("%s-%d stopped unexpectedly", self.name, replica.index)
            for pending in live:  # the watchdog replaces the replica; its requests get their error now
                _settle(pending.future, error=RuntimeError(f"replica {replica.index} failed: "
                                                           f"{type(error).__name__}: {error}"))

    def _process(self, batch: list[_Pending], run_batch: RunBatch) -> None:
        texts = sum(pending.size for pending in batch)
        stats = self.stats
        stats.batches += 1
        stats.requests += len(batch)
        stats.texts += texts
        stats.tokens += sum(pending.tokens for pending in batch)
        stats.sizes[texts] += 1
        stats.largest_batch_texts = max(stats.largest_batch_texts, texts)
        try:
            results = list(run_batch([pending.item for pending in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} requests")
        except Exception as error:
            if len(batch) == 1:
                _settle(batch[0].future, error=error)
                return
            # One request may have broken the whole pass: run each alone so only that one fails.
            LOG.warning("a batch of %d requests failed (%s: %s); running each alone", len(batch),
                        type(error).__name__, error)
            stats.retried_alone += len(batch)
            for pending in batch:
                try:
                    (result,) = run_batch([pending.item])
                except Exception as alone:
                    _settle(pending.future, error=alone)
                else:
                    _settle(pending.future, result=Outcome(result, pending.size))
            return
        for pending, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                _settle(pending.future, error=result)
            else:
                _settle(pending.future, result=Outcome(result, texts))

    # --- supervision -------------------------------------------------------------------------------------------

    def health(self) -> Health:
        """Healthy while at least one replica serves and is not stuck in a forward pass."""
        now = time.monotonic()
        problems = []
        serving = 0
        for slot in self._slots:
            replica = slot.replica
            if slot.state != "serving" or replica is None:
                problems.append(f"replica {slot.index} {slot.state} ({slot.reason})")
            elif self._stuck(replica, now):
                problems.append(f"replica {slot.index} stuck for {now - replica.busy_since:.0f} s")
            elif replica.thread is not None and not replica.thread.is_alive() and not self._stopping:
                problems.append(f"replica {slot.index} ended")
            else:
                serving += 1
        detail = f"{serving} of {len(self._slots)} replicas serving" + (f"; {'; '.join(problems)}" if problems
                                                                         else "")
        return Health(serving > 0, detail)

    def _stuck(self, replica: _Replica, now: float) -> bool:
        busy_since = replica.busy_since
        return self.stuck_after_s is not None and busy_since is not None and now - busy_since > self.stuck_after_s

    def _watch(self) -> None:
        while not self._stopped.wait(self.check_every_s):
            self.check()

    def check(self) -> None:
        """Retire dead or stuck replicas and start restart attempts that are due (the watchdog calls this)."""
        now = time.monotonic()
        for slot in self._slots:
            if self._stopping:
                return
            replica = slot.replica
            if slot.state == "serving" and replica is not None:
                reason = ("its thread ended" if replica.thread is not None and not replica.thread.is_alive()
                          else f"a forward pass has run over {self.stuck_after_s:g} s"
                          if self._stuck(replica, now) else None)
                if reason is None:
                    continue
                LOG.error("replica %d: %s; replacing it (the other replicas keep serving)", slot.index, reason)
                replica.retired = True
                with self._condition:
                    self._condition.notify_all()
                slot.replica, slot.state, slot.reason, slot.next_attempt = None, "waiting", reason, now
            if slot.state == "waiting" and now >= slot.next_attempt:
                slot.state = "restarting"
                threading.Thread(target=self._attempt_restart, args=(slot,), name=f"{self.name}-restart-{slot.index}",
                                 daemon=True).start()

    def _attempt_restart(self, slot: _Slot) -> None:
        try:
            run_batch = self._restart(slot.index)
        except Exception as error:
            slot.failures += 1
            self.stats.failed_restarts += 1
            delay = min(self.backoff_s * 2 ** (slot.failures - 1), self.backoff_cap_s)
            slot.reason = f"restart failed: {type(error).__name__}: {error}"
            LOG.error("replica %d: restart attempt %d failed (%s: %s); next attempt in %.0f s", slot.index,
                      slot.failures, type(error).__name__, error, delay)
            slot.next_attempt = time.monotonic() + delay
            slot.state = "waiting"
            return
        replica = _Replica(slot.index, run_batch)
        if self._stopping:
            slot.state = "waiting"
            return
        self._launch(replica)
        slot.replica, slot.state, slot.failures, slot.reason = replica, "serving", 0, ""
        self.stats.restarts += 1
        LOG.warning("replica %d restarted", slot.index)
