"""Erasing a user from the graph: the erasure mark (persists of the user's earlier work are dropped, and wait
while the deletes run) and the deletes themselves, in batches. Part of Neo4jGraphStore."""

from __future__ import annotations

import logging
import time
import uuid

from neo4j import ManagedTransaction, Session

from worker.graph.errors import translated
from worker.graph.parts import StorePart
from worker.identity import user_tag
from worker.models import DeleteReport

log = logging.getLogger("worker.graph.neo4j_store")


# erasing_until: while the erasure's delete batches run (each its own transaction), persists of the user
# wait (a transient error), so nothing accepted after the mark is half-deleted by a later batch.
MARK_ERASED = """
MERGE (u:UserMark {user_tag: $tag})
SET u.erased_at = CASE WHEN coalesce(u.erased_at, 0.0) > $at THEN u.erased_at ELSE $at END,
    u.erasing_until = $until, u.erasing_token = $token
"""

# Each delete batch keeps the window open (an erasure longer than its window would otherwise let work accepted
# after the mark be saved, then half-deleted by a later batch); a dead eraser's window lapses after its last.
RENEW_ERASING = """
MATCH (u:UserMark {user_tag: $tag}) WHERE u.erasing_token = $token
SET u.erasing_until = CASE WHEN u.erasing_until > $until THEN u.erasing_until ELSE $until END
"""

# Only the erasure that opened the window closes it (two erasures of one user may overlap).
ERASURE_DONE = """
MATCH (u:UserMark {user_tag: $tag}) WHERE u.erasing_token = $token
REMOVE u.erasing_until, u.erasing_token
"""

COUNT_USER_RELATIONSHIPS = """
MATCH (:Entity {user_id: $user_id})-[r:RELATED_TO]->()
RETURN count(r) AS n
"""

DELETE_USER_EPISODES_BATCH = """
MATCH (n:Episode {user_id: $user_id})
WITH n LIMIT $batch
DETACH DELETE n
RETURN count(*) AS n
"""

DELETE_USER_CHUNKS_BATCH = """
MATCH (n:Chunk {user_id: $user_id})
WITH n LIMIT $batch
DETACH DELETE n
RETURN count(*) AS n
"""

DELETE_USER_ENTITIES_BATCH = """
MATCH (n:Entity {user_id: $user_id})
WITH n LIMIT $batch
DETACH DELETE n
RETURN count(*) AS n
"""

DELETE_USER_PROGRESS_BATCH = """
MATCH (n:SessionProgress {user_id: $user_id})
WITH n LIMIT $batch
DETACH DELETE n
RETURN count(*) AS n
"""

DELETE_USER_FORGOTTEN_BATCH = """
MATCH (n:Forgotten {user_id: $user_id})
WITH n LIMIT $batch
DETACH DELETE n
RETURN count(*) AS n
"""

# Episodes first (their MENTIONS go with them), then entities (with their RELATED_TO), then their search
# windows and session progress (counted together as other nodes).
DELETE_USER_BATCHES = (
    DELETE_USER_EPISODES_BATCH,
    DELETE_USER_ENTITIES_BATCH,
    DELETE_USER_CHUNKS_BATCH,
    DELETE_USER_PROGRESS_BATCH,
    DELETE_USER_FORGOTTEN_BATCH,  # tombstones of forgotten episodes and sessions (the erasure mark covers them)
)


class UserErasure(StorePart):
    """mark_erased, erasure_done and delete_user of Neo4jGraphStore, which gives the session and write
    transaction they run in."""

    _delete_batch: int

    def mark_erased(self, user_id: str, at: float, erasing_for_s: float = 600.0) -> str:
        """Record that the user was erased at `at` (epoch seconds): from now on, persist transactions drop
        the user's work accepted before it, and wait while the erasure runs (until erasure_done with the
        token returned here, or for erasing_for_s if the eraser died). Kept under the user's tag (a hash)."""
        tag, token = user_tag(user_id), uuid.uuid4().hex
        until = time.time() + erasing_for_s
        with translated("mark_erased"), self._session() as session:
            self._write(
                session,
                lambda tx: tx.run(MARK_ERASED, tag=tag, at=at, until=until, token=token).consume(),
            )
        return token

    def erasure_done(self, user_id: str, token: str) -> None:
        with translated("erasure_done"), self._session() as session:
            self._write(session, lambda tx: tx.run(ERASURE_DONE, tag=user_tag(user_id), token=token).consume())

    def delete_user(self, user_id: str, window: str | None = None, erasing_for_s: float = 600.0) -> DeleteReport:
        """Batches of delete_batch nodes, each its own transaction, so 100k nodes never build one huge tx.
        With `window` (mark_erased's token), each batch also keeps that window open for erasing_for_s more."""
        renew = (user_tag(user_id), window, erasing_for_s) if window is not None else None
        with translated("delete_user"), self._session() as session:
            relationships = session.execute_read(
                lambda tx: tx.run(COUNT_USER_RELATIONSHIPS, user_id=user_id).single(strict=True)["n"]
            )
            counts = [self._delete_in_batches(session, s, user_id, renew) for s in DELETE_USER_BATCHES]
        log.info("deleted user graph", extra={"user_id": user_id, "episodes": counts[0], "entities": counts[1]})
        return DeleteReport(
            user_id=user_id,
            episodes=counts[0],
            entities=counts[1],
            relationships=relationships,
            session_progress=counts[DELETE_USER_BATCHES.index(DELETE_USER_PROGRESS_BATCH)],
        )

    def _delete_in_batches(
        self, session: Session, statement: str, user_id: str, renew: tuple[str, str, float] | None
    ) -> int:
        def batch(tx: ManagedTransaction) -> int:
            if renew is not None:
                tag, token, for_s = renew
                tx.run(RENEW_ERASING, tag=tag, token=token, until=time.time() + for_s).consume()
            n: int = tx.run(statement, user_id=user_id, batch=self._delete_batch).single(strict=True)["n"]
            return n

        total = 0
        while (n := self._write(session, batch, bulk=True)) > 0:
            total += n
        return total
