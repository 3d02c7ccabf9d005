"""Calls recall starts but does not always wait for (LLM keywords, query embeddings): a small pool, one call
per key at a time (the same query asked twice shares it), and a bound on how many may be pending, beyond
which recall does not start another (it answers without, within its budget)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from threading import Lock
from typing import Generic, TypeVar

T = TypeVar("T")


class BackgroundCalls(Generic[T]):
    def __init__(self, name: str, workers: int, max_pending: int) -> None:
        self._name = name
        self._workers = workers
        self.max_pending = max_pending
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future[T]] = {}
        self._lock = Lock()

    def submit(self, key: str, call: Callable[[], T]) -> Future[T] | None:
        """The running call for key, or a new one; None when max_pending calls are already pending."""
        with self._lock:
            running = self._pending.get(key)
            if running is not None:
                return running
            if len(self._pending) >= self.max_pending:
                return None
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix=self._name)
            future = self._pool.submit(call)
            self._pending[key] = future
        future.add_done_callback(lambda _f: self._done(key))
        return future

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _done(self, key: str) -> None:
        with self._lock:
            self._pending.pop(key, None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
