"""The batcher under a batch that fails as a whole (issue 33 item 5): when a batch's own size makes it fail
(a transaction timeout, a lock wait), the next batches are smaller, so retrying callers get through instead
of being batched again at full size until they are all dead-lettered; full batches come back as batches commit."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from worker.errors import StoreUnavailable
from worker.graph.batcher import Batcher, Waiting


@dataclass
class Item(Waiting):
    value: int = 0


class TooBigFails(Batcher[Item]):
    """A store that times out on a batch of more than `most` items."""

    def __init__(self, most: int) -> None:
        super().__init__(max_batch=16, linger_s=0.3, gap_s=0.3, wait_s=30)
        self.most = most
        self.sizes: list[int] = []

    def handle(self, items: list[Item]) -> None:
        self.sizes.append(len(items))
        if len(items) > self.most:
            raise StoreUnavailable("transaction timed out", cause="TransientError")
        for item in items:
            item.result = item.value

    def save(self, value: int) -> int:
        result: int = self._hand_over(Item(value=value))
        return result


def test_callers_of_a_batch_too_big_to_commit_get_through_in_smaller_batches() -> None:
    batcher = TooBigFails(most=3)
    got = _retried(batcher, n=16, attempts=6)
    assert got == {i: i for i in range(16)}
    assert batcher.sizes[0] == 16 and max(batcher.sizes[1:]) < 16


def test_full_batches_come_back_once_smaller_ones_commit() -> None:
    batcher = TooBigFails(most=3)
    _retried(batcher, n=16, attempts=6)
    batcher.most = 100  # the store is well again
    for _ in range(20):
        assert len(_retried(batcher, n=16, attempts=1)) == 16
    assert batcher.sizes[-1] == 16


def _retried(batcher: TooBigFails, n: int, attempts: int) -> dict[int, int]:
    """n callers; after a failure, each sends again together with the others still failing."""
    got: dict[int, int] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        for _ in range(attempts):
            try:
                value = batcher.save(i)
            except StoreUnavailable:
                time.sleep(0.05)
                continue
            with lock:
                got[i] = value
            return

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return got
