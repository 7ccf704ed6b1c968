"""Gather concurrent requests into one forward pass, on one inference thread, behind a bounded queue.

Requests come from the event loop (`submit`); one thread takes them in arrival order. When it finds the queue
empty it waits for the first request, then up to `max_wait_s` for more, and takes as many as fit in
`max_batch_size` texts (a request larger than that runs alone; requests are never split, so each answer is
whole). While a forward pass runs, new requests queue up and form the next batch without waiting: under load
batches fill on their own, and at low load a request waits at most `max_wait_s`.

- Each request's answer goes to its own future, so it returns to its own caller.
- If a batch's forward pass raises, each of its requests is run again on its own: only a request that fails
  alone gets the error; its neighbours get their answers.
- The queue holds at most `max_queue` texts. A request that would go beyond it raises `Overloaded` at once,
  without waiting, so an overloaded instance answers 503 quickly and memory stays bounded.

Nothing here knows about HTTP or torch: `run_batch(items) -> results` does the work.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

LOG = logging.getLogger(__name__)


class Overloaded(Exception):
    """The queue is full: answer 503 now rather than make the caller wait behind it."""


class Stopped(Exception):
    """The batcher stopped before it could take the request."""


@dataclass
class _Pending:
    item: Any
    size: int
    future: Future
    queued_at: float


@dataclass
class BatchStats:
    """Counters the server reports (and tests read): how many batches, of how many requests and texts."""

    batches: int = 0
    requests: int = 0
    texts: int = 0
    rejected: int = 0
    retried_alone: int = 0
    largest_batch_texts: int = 0
    sizes: collections.Counter = field(default_factory=collections.Counter)  # texts per batch -> batches


@dataclass(frozen=True)
class Outcome:
    """A request's answer, with how many texts shared its forward pass."""

    result: Any
    batch_texts: int


class Batcher:
    """One inference thread fed by a bounded queue; `run_batch` gets a list of items, returns one result each."""

    def __init__(self, run_batch: Callable[[Sequence[Any]], Sequence[Any]], *, max_batch_size: int,
                 max_wait_s: float, max_queue: int, name: str = "batcher"):
        if max_batch_size < 1 or max_queue < 1 or max_wait_s < 0:
            raise ValueError("max_batch_size and max_queue must be at least 1, max_wait_s at least 0")
        self._run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.stats = BatchStats()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._queued_texts = 0
        self._condition = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def queued_texts(self) -> int:
        return self._queued_texts

    def start(self) -> Batcher:
        self._thread.start()
        return self

    def submit(self, item: Any, size: int) -> Future:
        """Queue one request of `size` texts; its Future resolves to an `Outcome` or raises the request's error."""
        if size < 1:
            raise ValueError("a request has at least one text")
        future: Future = Future()
        with self._condition:
            if self._stopping:
                raise Stopped("the server is stopping")
            # Always admit a request into an empty queue, so one larger than max_queue is not refused forever.
            if self._queue and self._queued_texts + size > self.max_queue:
                self.stats.rejected += 1
                raise Overloaded(f"{self._queued_texts} texts already wait (at most {self.max_queue})")
            self._queue.append(_Pending(item, size, future, time.monotonic()))
            self._queued_texts += size
            self._condition.notify()
        return future

    async def run(self, item: Any, size: int) -> Outcome:
        """`submit` for the event loop: waits for the answer without blocking the loop."""
        return await asyncio.wrap_future(self.submit(item, size))

    def stop(self, timeout: float | None = None) -> None:
        """Answer everything already queued, then end the thread."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _take(self) -> list[_Pending] | None:
        """The next batch: wait for a first request, then up to max_wait_s for more; None once stopped and empty."""
        with self._condition:
            while not self._queue:
                if self._stopping:
                    return None
                self._condition.wait()
            deadline = time.monotonic() + self.max_wait_s
            while self._queued_texts < self.max_batch_size and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._condition.wait(remaining)
            batch = [self._queue.popleft()]
            texts = batch[0].size
            while self._queue and texts + self._queue[0].size <= self.max_batch_size:
                pending = self._queue.popleft()
                batch.append(pending)
                texts += pending.size
            self._queued_texts -= texts
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            live = [pending for pending in batch if pending.future.set_running_or_notify_cancel()]
            if live:
                self._process(live)

    def _process(self, batch: list[_Pending]) -> None:
        texts = sum(pending.size for pending in batch)
        stats = self.stats
        stats.batches += 1
        stats.requests += len(batch)
        stats.texts += texts
        stats.sizes[texts] += 1
        stats.largest_batch_texts = max(stats.largest_batch_texts, texts)
        try:
            results = list(self._run_batch([pending.item for pending in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} requests")
        except Exception as error:
            if len(batch) == 1:
                batch[0].future.set_exception(error)
                return
            # One request may have broken the whole pass: run each alone so only that one fails.
            LOG.warning("a batch of %d requests failed (%s: %s); running each alone", len(batch),
                        type(error).__name__, error)
            stats.retried_alone += len(batch)
            for pending in batch:
                try:
                    (result,) = self._run_batch([pending.item])
                except Exception as alone:
                    pending.future.set_exception(alone)
                else:
                    pending.future.set_result(Outcome(result, pending.size))
            return
        for pending, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(Outcome(result, texts))
