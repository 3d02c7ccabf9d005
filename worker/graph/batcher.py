"""What the group commit and the group read share: callers in many threads hand over one item each and wait;
one thread of the process takes what is waiting and handles it as one batch (one Neo4j transaction or query).

A caller waits at most `wait_s`, then fails with StoreUnavailable (its task retries). A batch the handler fails
with StoreUnavailable fails each of its callers with a copy of that error, and the batches after it hold at most
half as many items (a batch too big to commit in time, or waiting on locks for its size, would otherwise come
back at full size with every retry); each batch that commits raises that limit by one again, up to max_batch. Any
other failure is handled again item by item, so only the bad item fails.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from worker.errors import StoreError, StoreUnavailable

log = logging.getLogger(__name__)


@dataclass
class Waiting:
    """One caller's item: its answer (result or error) is set before `done`."""

    done: threading.Event = field(default_factory=threading.Event, init=False)
    result: Any = field(default=None, init=False)
    error: BaseException | None = field(default=None, init=False)


W = TypeVar("W", bound=Waiting)


class Batcher(Generic[W]):
    name = "batch"  # the handler thread's name; errors name the class
    late = "the batch holding this item did not finish in time"

    def __init__(
        self, max_batch: int, linger_s: float, gap_s: float, wait_s: float, stuck_s: float | None = None
    ) -> None:
        """max_batch: most items in one batch (1: each alone, in its caller's thread); linger_s: how long the
        handler gathers once it holds one; gap_s: a gap this long with nothing new ends the gathering;
        wait_s: how long a caller waits for its batch; stuck_s: a handler busy on one batch for longer is
        left to finish it alone, and a new one, started by a caller still waiting, takes the items after it
        (None: never; only for items without a key: what a replaced handler held back for a later batch
        goes back to the queue only when its batch ends)."""
        self._max_batch = max_batch
        self._limit = max_batch  # halved by a batch that fails as a whole, one more after one that commits
        self._linger_s = linger_s
        self._gap_s = gap_s
        self._wait_s = wait_s
        self._stuck_s = stuck_s
        self._queue: queue.SimpleQueue[W] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._busy: tuple[threading.Thread, float] | None = None  # the handler on a batch, since when

    def handle(self, items: list[W]) -> None:
        """Answer each item (set its result or error); raising fails what it left unanswered."""
        raise NotImplementedError

    def keys(self, item: W) -> tuple[Hashable, ...]:
        """Items that share a key are never in one batch (a later one waits for the next); none: any."""
        return ()

    def _hand_over(self, item: W) -> Any:
        """The item's result, once its batch is handled (its error raised)."""
        if self._max_batch <= 1:
            self._answer([item])
        else:
            self._start()
            self._queue.put(item)
            if not self._wait(item):
                raise StoreUnavailable(self.late, cause=type(self).__name__)
        if item.error is not None:
            raise item.error
        return item.result

    def _wait(self, item: W) -> bool:
        """Whether the item was answered within wait_s; while it waits, a stuck handler is replaced."""
        if self._stuck_s is None:
            return item.done.wait(self._wait_s)
        deadline = time.monotonic() + self._wait_s
        while not item.done.wait(min(self._stuck_s, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                return False
            self._start()
        return True

    def _start(self) -> None:
        with self._lock:
            busy = self._busy
            stuck = (
                self._stuck_s is not None
                and busy is not None
                and busy[0] is self._thread
                and time.monotonic() - busy[1] > self._stuck_s
            )
            if self._thread is None or not self._thread.is_alive() or stuck:
                if stuck:
                    log.warning("batch handler stuck; a new one takes over", extra={"batcher": type(self).__name__})
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def _current(self) -> bool:
        return self._thread is threading.current_thread()

    def _run(self) -> None:
        deferred: list[W] = []
        try:
            while self._current():
                try:
                    batch, deferred = self._gather(deferred)
                    with self._lock:
                        self._busy = (threading.current_thread(), time.monotonic())
                    self._answer(batch)
                except Exception as exc:  # never leave callers waiting on a dead handler
                    log.error("batch handler failed", extra={"error_class": type(exc).__name__})
                finally:
                    with self._lock:
                        if self._busy is not None and self._busy[0] is threading.current_thread():
                            self._busy = None
        finally:
            for item in deferred:  # replaced (or dying) while it held these: the next handler takes them
                self._queue.put(item)

    def _gather(self, deferred: list[W]) -> tuple[list[W], list[W]]:
        """The next batch, and what waits for a later one: what waits already, then whatever arrives within
        linger_s (a gap of gap_s ends it), up to max_batch."""
        batch: list[W] = []
        later: list[W] = []
        taken: set[Hashable] = set()

        def take(item: W) -> None:
            keys = self.keys(item)
            if taken.intersection(keys) or len(batch) >= self._limit:
                later.append(item)
            else:
                batch.append(item)
            taken.update(keys)  # held back too: nothing after it that shares a key goes ahead of it

        for item in deferred:
            take(item)
        if not batch:
            take(self._queue.get())
        until = time.monotonic() + self._linger_s
        while len(batch) < self._limit:
            left = until - time.monotonic()
            if left <= 0:
                break
            try:
                take(self._queue.get(timeout=min(left, self._gap_s)))
            except queue.Empty:
                break
        return batch, later

    def _answer(self, batch: list[W]) -> None:
        try:
            self.handle(batch)
        except StoreUnavailable as exc:
            for item in batch:  # each caller raises its own copy (a traceback is per raise)
                item.error = _copy(exc)
            if len(batch) > 1:
                self._limit = max(1, len(batch) // 2)
                log.warning(
                    "batch failed as a whole; the next ones are smaller",
                    extra={"batcher": type(self).__name__, "items": len(batch), "limit": self._limit},
                )
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
            else:
                log.warning(
                    "batch refused; handling its items one by one",
                    extra={"batcher": type(self).__name__, "items": len(batch), "error_class": error_class(exc)},
                )
                for item in batch:
                    self._answer([item])
        else:
            self._limit = min(self._max_batch, self._limit + 1)
        finally:
            for item in batch:
                if item.result is None and item.error is None:
                    item.error = StoreUnavailable("the batch holding this item failed", cause=type(self).__name__)
                item.done.set()


def _copy(exc: StoreUnavailable) -> StoreUnavailable:
    copy = StoreUnavailable(str(exc), cause=exc.cause)
    copy.__cause__ = exc.__cause__ or exc
    return copy


def error_class(exc: BaseException) -> str:
    return (exc.cause if isinstance(exc, StoreError) else None) or type(exc).__name__
