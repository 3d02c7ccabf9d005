"""The read the extract stage makes before it calls the model (the session's line, the user's last erasure and
forgets, an episode already stored under the id), and the group read that serves many extract threads at once.

Every extract task makes this read first. Alone, it is a query of its own: a session, a round trip and the
server's per-query work, paid per episode (measured here: about 1.1 ms of CPU per read, client and server
together, and 0.2 ms per read in batches of 8). `GroupRead` hands the reads that extract threads ask for while
it gathers to one query (UNWIND), and gives each thread its own row. A read in a batch is made after the
thread asked for it, so what it sees is never older than what a read of its own would have seen.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from neo4j import Session

from worker.errors import StoreUnavailable
from worker.graph import cypher
from worker.graph.forget import episode_tombstone, session_tombstone
from worker.identity import user_tag
from worker.sessions import StoredLine, WriteState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateRequest:
    user_id: str
    key: str  # the session's progress key (worker/sessions.py progress_key)
    episode_id: str


def read_states(session: Session, requests: Sequence[StateRequest]) -> list[WriteState]:
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
    for row in session.run(cypher.WRITE_STATES, rows=rows):
        states[int(row["i"])] = _state(row)
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
class _Asked:
    request: StateRequest
    done: threading.Event = field(default_factory=threading.Event)
    state: WriteState | None = None
    error: BaseException | None = None


class GroupRead:
    def __init__(
        self,
        read_many: Callable[[Sequence[StateRequest]], list[WriteState]],
        max_batch: int,
        linger_s: float,
        wait_s: float,
    ) -> None:
        """read_many: the reads of a batch, in order (Neo4jGraphStore.write_states); max_batch: most reads in
        one query; linger_s: how long the reader gathers once it holds one (0: each read alone, in its
        caller's thread); wait_s: how long a caller waits for its batch before StoreUnavailable."""
        self._read_many = read_many
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._wait_s = wait_s
        self._queue: queue.SimpleQueue[_Asked] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def write_state(self, user_id: str, key: str, episode_id: str) -> WriteState:
        """As Neo4jGraphStore.write_state, in a query shared with the other threads asking meanwhile."""
        asked = _Asked(StateRequest(user_id, key, episode_id))
        if self._linger_s <= 0 or self._max_batch <= 1:
            self._read([asked])
        else:
            self._start()
            self._queue.put(asked)
            if not asked.done.wait(self._wait_s):
                raise StoreUnavailable("the read holding this episode did not finish in time", cause="GroupRead")
        if asked.error is not None:
            raise asked.error
        assert asked.state is not None
        return asked.state

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="extract-group-read", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._read(self._gather())
            except Exception as exc:  # never leave callers waiting on a dead reader
                log.error("extract reader failed", extra={"error_class": type(exc).__name__})

    def _gather(self) -> list[_Asked]:
        """What is waiting: the first read, then whatever arrives within linger_s, up to max_batch."""
        batch = [self._queue.get()]
        until = time.monotonic() + self._linger_s
        while len(batch) < self._max_batch:
            left = until - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(self._queue.get(timeout=left))
            except queue.Empty:
                break
        return batch

    def _read(self, batch: list[_Asked]) -> None:
        try:
            states = self._read_many([a.request for a in batch])
        except StoreUnavailable as exc:
            for a in batch:  # each caller raises its own copy (a traceback is per raise)
                a.error = StoreUnavailable(str(exc), cause=exc.cause)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
            else:  # one bad request must not fail the others: each read again alone
                for a in batch:
                    self._read([a])
        else:
            for a, state in zip(batch, states, strict=True):
                a.state = state
        finally:
            for a in batch:
                a.done.set()
