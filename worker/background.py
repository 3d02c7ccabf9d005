"""Calls a caller starts but may stop waiting for (recalls, LLM keywords, query embeddings): a small pool, one
call per key at a time (the same query asked twice shares it), and a bound on how many may be pending. A new
call waits for a free slot at most `wait_s`; beyond that it is not started (the caller answers without it,
within its budget), so calls stuck on a stalled service never pile up without bound."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from threading import BoundedSemaphore, Lock
from typing import Generic, TypeVar

T = TypeVar("T")


class BackgroundCalls(Generic[T]):
    def __init__(self, name: str, workers: int, max_pending: int) -> None:
        self._name = name
        self._workers = workers
        self.max_pending = max_pending
        self._slots = BoundedSemaphore(max_pending)
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future[T]] = {}
        self._lock = Lock()
        self._closed = False

    def submit(self, key: str, call: Callable[[], T], wait_s: float = 0.0) -> Future[T] | None:
        """The running call for key, or a new one once a slot is free; None when none freed within wait_s."""
        with self._lock:
            running = self._pending.get(key)
            if running is not None:
                return running
        if not (self._slots.acquire(timeout=wait_s) if wait_s > 0 else self._slots.acquire(blocking=False)):
            return None
        with self._lock:
            running = self._pending.get(key)
            if running is not None or self._closed:
                self._slots.release()
                return running
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
        self._slots.release()

    def close(self, wait_s: float = 0.0) -> None:
        """No new call starts; calls not yet started are cancelled; calls already running are waited for up
        to wait_s, so what they hold (a connection mid-query) is released before the caller closes it."""
        with self._lock:
            self._closed = True
            pool = self._pool
            running = list(self._pending.values())
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            started = [f for f in running if not f.cancelled()]  # a cancelled one is never "done" to wait()
            if wait_s > 0 and started:
                wait(started, timeout=wait_s)
