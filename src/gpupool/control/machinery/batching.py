"""Group commit: concurrent requests written together, each answered only after the commit.

A commit costs a round trip and, on the database side, a durable log flush; most of a small
write's cost is the transaction around it. :class:`GroupCommit` lets many concurrent callers
share one: callers (coroutines on any event loop) hand an item to :meth:`GroupCommit.submit`
and await its result; one writer thread takes the items queued at that moment (at most
``max_items``) and calls ``write(items)``, which must write them all in one transaction and
return one outcome per item, in order: a result, or an exception for that item alone.

Words and rules:

- **batch**: the items one ``write`` call gets. The writer does not wait for a batch to fill:
  it takes what is queued. Only when the previous batch had several items (callers are
  concurrent) does it wait up to ``max_wait_s`` for as many as that batch had, so batches
  stay large under load and a lone caller is never delayed.
- **acknowledged**: a caller's await returns only after ``write`` returned, i.e. after the
  commit; nothing a caller was told is written can be lost by a crash after that point.
- If ``write`` raises, every item of the batch gets that exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def _settle(future: asyncio.Future[R], outcome: R | BaseException) -> None:
    if future.done():  # the caller went away (cancelled); the write stands
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class GroupCommit(Generic[T, R]):
    """See the module docstring."""

    def __init__(
        self,
        write: Callable[[Sequence[T]], Sequence[R | BaseException]],
        *,
        max_items: int = 64,
        max_wait_s: float = 0.001,
        writers: int = 1,
        name: str = "group-commit",
    ) -> None:
        self._write = write
        self.max_items = max(1, max_items)
        self.max_wait_s = max_wait_s
        self._name = name
        # (item, the caller's loop, its future); None tells the writer to stop
        self._queue: queue.SimpleQueue[
            tuple[T, asyncio.AbstractEventLoop, asyncio.Future[R]] | None
        ] = queue.SimpleQueue()
        self.writers = max(1, writers)
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self.batches = 0  # batches written so far
        self.items = 0  # items written so far

    async def submit(self, item: T) -> R:
        """Queue ``item`` and wait until the batch holding it is written; its outcome."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._ensure_started()
        self._queue.put((item, loop, future))
        return await future

    def _ensure_started(self) -> None:
        if self._threads:
            return
        with self._start_lock:
            if not self._threads:
                threads = [
                    threading.Thread(target=self._run, name=f"{self._name}-{n}", daemon=True)
                    for n in range(self.writers)
                ]
                for thread in threads:
                    thread.start()
                self._threads = threads

    def _collect(
        self, first: tuple[T, asyncio.AbstractEventLoop, asyncio.Future[R]], last_size: int
    ) -> tuple[list[tuple[T, asyncio.AbstractEventLoop, asyncio.Future[R]]], bool]:
        batch, stop = [first], False
        deadline = time.monotonic() + self.max_wait_s
        want = min(self.max_items, max(1, last_size))
        while len(batch) < self.max_items:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                left = deadline - time.monotonic()
                if len(batch) >= want or left <= 0:
                    break
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
            if item is None:
                stop = True
                break
            batch.append(item)
        return batch, stop

    def _run(self) -> None:
        last_size = 1
        while True:
            first = self._queue.get()
            if first is None:
                return
            entries, stop = self._collect(first, last_size)
            last_size = len(entries)
            items = [e[0] for e in entries]
            try:
                outcomes: Sequence[R | BaseException] = self._write(items)
                if len(outcomes) != len(items):
                    raise RuntimeError("group commit: write returned the wrong number of outcomes")
            except BaseException as exc:  # every caller must hear back, whatever happened
                outcomes = [exc] * len(items)
            self.batches += 1
            self.items += len(items)
            for (_item, loop, future), outcome in zip(entries, outcomes, strict=True):
                with contextlib.suppress(RuntimeError):  # that caller's event loop is closed
                    loop.call_soon_threadsafe(_settle, future, outcome)
            if stop:
                return

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the writers after the items already queued (idempotent)."""
        threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join(timeout_s)
