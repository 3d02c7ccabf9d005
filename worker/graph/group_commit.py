"""Group commit for the persist stage: the episodes that persist threads hand over while a transaction runs
are written together in the next one.

Each persist task still handles one message: it hands its extraction to `GroupCommit.save` and waits for
the transaction holding it, so its message is acknowledged only after that commit, and its retries, dead
letter and outcome stay its own. One thread per process writes: it takes what is waiting (at most
`max_batch` episodes) and writes it with `save_episodes` in one transaction. Under a light load a batch is
one episode and nothing waits longer than before; under a heavy one, the commit, the fulltext refresh and
the round trips are paid once per batch.

A failure of a batch:
- transient (Neo4j away, a timeout, a deadlock): every episode of it gets the error, and each task retries
  with backoff as it would alone (a user being erased is not such a failure: only that user's episodes
  wait, outcome `erasing`);
- anything else (one episode refused, e.g. an id that belongs to another user): each episode of the batch
  is written again alone, so only the bad one fails (and is retried or dead-lettered by its task).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from worker.errors import StoreError, StoreUnavailable
from worker.graph.params import EpisodeWrite
from worker.graph.protocol import GraphStore
from worker.models import Entity, EpisodeRecord, Relationship, SaveResult, SessionProgress

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    write: EpisodeWrite
    progress: SessionProgress | None
    done: threading.Event = field(default_factory=threading.Event)
    result: SaveResult | None = None
    error: BaseException | None = None

    @property
    def episode_id(self) -> str:
        return self.write[0].id


class GroupCommit:
    def __init__(
        self,
        store: GraphStore,
        max_batch: int,
        linger_s: float,
        wait_s: float,
        committed: Callable[[int], None] = lambda episodes: None,
    ) -> None:
        """max_batch: most episodes in one transaction (1: each alone, no writer thread); linger_s: how long
        the writer waits for more once it holds one; wait_s: how long a caller waits for its batch before
        it fails with StoreUnavailable (its task retries; a save that still commits later is found stored
        by the retry); committed(episodes) is told of each transaction committed."""
        self._store = store
        self._committed = committed
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._wait_s = wait_s
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def save(
        self,
        record: EpisodeRecord,
        entities: Sequence[Entity],
        relationships: Sequence[Relationship],
        progress: SessionProgress | None = None,
    ) -> SaveResult:
        """Write one episode (as Neo4jGraphStore.save_episode), in a transaction shared with others."""
        item = _Pending((record, entities, relationships), progress)
        if self._max_batch <= 1:
            self._commit([item])
        else:
            self._start()
            self._queue.put(item)
            if not item.done.wait(self._wait_s):
                raise StoreUnavailable("the batch holding this episode did not finish in time", cause="GroupCommit")
        if item.error is not None:
            raise item.error
        assert item.result is not None
        return item.result

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="persist-group-commit", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        deferred: list[_Pending] = []
        while True:
            try:
                batch, deferred = self._gather(deferred)
                self._commit(batch)
            except Exception as exc:  # never leave callers waiting on a dead writer
                log.error("persist writer failed", extra={"error_class": type(exc).__name__})

    def _gather(self, deferred: list[_Pending]) -> tuple[list[_Pending], list[_Pending]]:
        """The next batch, and what waits for a later one. At most one episode per session (and so per
        episode id) in a batch: the session line a send is checked against is then the one stored, exactly
        as if the sends were written one by one. Lingers while episodes keep arriving (a gap of a fifth of
        linger_s ends it), up to linger_s."""
        batch: list[_Pending] = []
        later: list[_Pending] = []
        sessions: set[tuple[str, str]] = set()

        def take(item: _Pending) -> None:
            session = (item.write[0].user_id, item.write[0].session_id)
            if session in sessions or len(batch) >= self._max_batch:
                later.append(item)
            else:
                batch.append(item)
                sessions.add(session)

        for item in deferred:
            take(item)
        if not batch:
            take(self._queue.get())
        until = time.monotonic() + self._linger_s
        gap = self._linger_s / 5
        while len(batch) < self._max_batch:
            left = until - time.monotonic()
            if left <= 0:
                break
            try:
                take(self._queue.get(timeout=min(left, gap)))
            except queue.Empty:
                break
        return batch, later

    def _commit(self, batch: list[_Pending]) -> None:
        try:
            progress = {p.episode_id: p.progress for p in batch if p.progress is not None}
            results = self._store.save_episodes([p.write for p in batch], progress)
        except StoreUnavailable as exc:
            for p in batch:  # each caller raises its own copy (a traceback is per raise)
                p.error = StoreUnavailable(str(exc), cause=exc.cause)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
            else:
                log.warning(
                    "persist batch refused; writing its episodes one by one",
                    extra={"episodes": len(batch), "error_class": _error_class(exc)},
                )
                for p in batch:
                    self._commit([p])
        else:
            for p, result in zip(batch, results, strict=True):
                p.result = result
            self._committed(len(batch))
        finally:
            for p in batch:
                p.done.set()


def _error_class(exc: BaseException) -> str:
    return (exc.cause if isinstance(exc, StoreError) else None) or type(exc).__name__
