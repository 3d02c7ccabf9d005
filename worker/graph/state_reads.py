"""The read the extract stage makes before it calls the model (the session's line, the user's last erasure and
forgets, an episode already stored under the id), and the group read that serves many extract threads at once.

Every extract task makes this read first. Alone, it is a query of its own: a session, a round trip and the
server's per-query work, paid per episode (bench_store `write_state_reads`: about 1.8 ms of CPU per read,
client and server together, and 0.2 ms per read in batches of 8). `GroupRead` hands the reads that extract
threads ask for while it gathers to one query (UNWIND), and gives each thread its own row. A read in a batch
is made after the thread asked for it, so what it sees is never older than what a read of its own would have
seen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from neo4j import ManagedTransaction

from worker.errors import StoreRequestError
from worker.graph import cypher
from worker.graph.batcher import Batcher, Waiting
from worker.graph.forget import episode_tombstone, session_tombstone
from worker.identity import user_tag
from worker.sessions import StoredLine, WriteState


@dataclass(frozen=True)
class StateRequest:
    user_id: str
    key: str  # the session's progress key (worker/sessions.py progress_key)
    episode_id: str


def read_states(tx: ManagedTransaction, requests: Sequence[StateRequest]) -> list[WriteState]:
    """The write state of each request, in order (one query)."""
    rows = [
        {
            "i": i,
            "key": r.key,
            "user_id": r.user_id,
            "tag": user_tag(r.user_id),
            "episode_id": r.episode_id,
            "tombstones": [episode_tombstone(r.user_id, r.episode_id), session_tombstone(r.key)],
        }
        for i, r in enumerate(requests)
    ]
    states: dict[int, WriteState] = {}
    for row in tx.run(cypher.WRITE_STATES, rows=rows):
        i = int(row["i"])
        if i in states:
            raise StoreRequestError(f"the write state query gave request {i} two rows", cause="WriteStates")
        states[i] = _state(row)
    if len(states) != len(requests):
        raise StoreRequestError(
            f"the write state query answered {len(states)} of {len(requests)} requests", cause="WriteStates"
        )
    return [states[i] for i in range(len(requests))]


def _state(row: Any) -> WriteState:
    line = None
    if row["extracted"] is not None:
        hashes = row["hashes"]
        line = StoredLine(int(row["extracted"]), str(row["digest"]), None if hashes is None else tuple(hashes))
    return WriteState(
        line=line,
        erased_at=float(row["erased_at"]),
        episode_user=row["episode_user"],
        episode_digest=row["episode_digest"],
        forgotten_at=float(row["forgotten_at"]),
    )


@dataclass
class _Asked(Waiting):
    request: StateRequest


class GroupRead(Batcher[_Asked]):
    name = "extract-group-read"
    late = "the read holding this episode did not finish in time"

    def __init__(
        self,
        read_many: Callable[[Sequence[StateRequest]], list[WriteState]],
        max_batch: int,
        linger_s: float,
        wait_s: float,
        stuck_s: float = 2.0,
    ) -> None:
        """read_many: the reads of a batch, in order (Neo4jGraphStore.write_states); max_batch: most reads in
        one query; linger_s: how long the reader gathers once it holds one (0: each read alone, in its
        caller's thread); wait_s: how long a caller waits for its batch before StoreUnavailable; stuck_s: a
        reader busy on one query for longer is left to it, and a new one reads what the others ask (a read
        changes nothing, so two readers are harmless; one slow query must not hold every extraction)."""
        super().__init__(max_batch if linger_s > 0 else 1, linger_s, linger_s, wait_s, stuck_s)
        self._read_many = read_many

    def write_state(self, user_id: str, key: str, episode_id: str) -> WriteState:
        """As Neo4jGraphStore.write_state, in a query shared with the other threads asking meanwhile."""
        state: WriteState = self._hand_over(_Asked(StateRequest(user_id, key, episode_id)))
        return state

    def handle(self, items: list[_Asked]) -> None:
        states = self._read_many([a.request for a in items])
        for a, state in zip(items, states, strict=True):
            a.result = state
