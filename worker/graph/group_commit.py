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
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from worker.graph.batcher import Batcher, Waiting
from worker.graph.params import EpisodeWrite
from worker.graph.protocol import GraphStore
from worker.models import Entity, EpisodeRecord, Relationship, SaveResult, SessionProgress

log = logging.getLogger(__name__)


@dataclass
class _Pending(Waiting):
    write: EpisodeWrite
    progress: SessionProgress | None

    @property
    def episode_id(self) -> str:
        return self.write[0].id


class GroupCommit(Batcher[_Pending]):
    name = "persist-group-commit"
    late = "the batch holding this episode did not finish in time"

    def __init__(
        self,
        store: GraphStore,
        max_batch: int,
        linger_s: float,
        wait_s: float,
        committed: Callable[[int], None] = lambda episodes: None,
    ) -> None:
        """max_batch: most episodes in one transaction (1: each alone, no writer thread); linger_s: how long
        the writer waits for more once it holds one (a gap of a fifth of it with nothing new ends the wait);
        wait_s: how long a caller waits for its batch before it fails with StoreUnavailable (its task
        retries; a save that still commits later is found stored by the retry); committed(episodes) is told
        of each transaction committed."""
        super().__init__(max_batch, linger_s, linger_s / 5, wait_s)
        self._store = store
        self._committed = committed

    def save(
        self,
        record: EpisodeRecord,
        entities: Sequence[Entity],
        relationships: Sequence[Relationship],
        progress: SessionProgress | None = None,
    ) -> SaveResult:
        """Write one episode (as Neo4jGraphStore.save_episode), in a transaction shared with others."""
        result: SaveResult = self._hand_over(_Pending((record, entities, relationships), progress))
        return result

    def keys(self, item: _Pending) -> tuple[Hashable, ...]:
        """At most one episode per session and one per episode id in a batch: the session line a send is
        checked against is then the one stored, and a second send of an id (another user's, another
        session's) is claimed and checked after the first, exactly as if the sends were written one by one."""
        record = item.write[0]
        return (("session", record.user_id, record.session_id), ("episode", record.id))

    def handle(self, items: list[_Pending]) -> None:
        results = self._store.save_episodes([p.write for p in items], [p.progress for p in items])
        for p, result in zip(items, results, strict=True):
            p.result = result
        try:  # committed: a failure to count it must not write the batch again
            self._committed(len(items))
        except Exception as exc:
            log.warning("commit not counted", extra={"error_class": type(exc).__name__})
