"""A user's memory read out in pages (export) and the parts of an import that saving episodes does not give
back (entity and relationship details, session progress). Part of Neo4jGraphStore.

Export reads each kind in pages by its key (episode id, entity uid, relationship ends, progress key), each
page its own short read: memory stays constant in the size of the user's history, and a page is never a
long transaction. It is not a snapshot: what is written while an export runs may or may not be in it.

An import saves the episodes through the ordinary persist transaction (worker/graph/save_tx.py), which
recounts mentions, weights and support exactly as it did when they were first saved; then it restores what
that cannot know: an entity's type, description and first/last seen times, a relationship's description,
and the sessions' extraction progress (which only moves forward).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from datetime import UTC, datetime
from typing import Any

from neo4j import ManagedTransaction

from worker.errors import StoreRequestError
from worker.graph import cypher
from worker.graph.errors import translated
from worker.graph.forget import session_tombstone
from worker.graph.parts import StorePart
from worker.graph.values import native
from worker.identity import user_tag
from worker.sessions import erased_since

FIRST_TIME = datetime(1, 1, 1, tzinfo=UTC)  # before any episode's time (an import accepts times before 1970)

COUNTS = """
CALL () { MATCH (e:Episode {user_id: $user_id}) RETURN count(e) AS episodes }
CALL () { MATCH (n:Entity {user_id: $user_id}) RETURN count(n) AS entities }
CALL () { MATCH (:Entity {user_id: $user_id})-[r:RELATED_TO]->() RETURN count(r) AS relationships }
CALL () { MATCH (p:SessionProgress {user_id: $user_id}) RETURN count(p) AS sessions }
RETURN episodes, entities, relationships, sessions
"""

# Episodes in the order they were stored (created_at, then id: the (user_id, created_at) index gives that
# order, so a page reads only its own rows), so an import saves them in that order. What
# each episode added: its mentions (entity, and the description this episode gave), the relationships
# it recorded when saved (rel_* lists; an episode saved before those existed gets an equal share of each
# relationship that lists it), and its search windows' embeddings in order.
EPISODES_PAGE = """
MATCH (e:Episode)
WHERE e.user_id = $user_id AND e.created_at >= $after_at AND (e.created_at > $after_at OR e.id > $after)
WITH e ORDER BY e.created_at, e.id LIMIT $page
RETURN e.id AS id, e.created_at AS at, e {.*, terms: null, user_tag: null, save_token: null} AS episode,
       COLLECT { MATCH (e)-[m:MENTIONS]->(n:Entity) RETURN [n.uid, n.name, n.type, m.description] ORDER BY n.uid }
         AS mentions,
       CASE WHEN e.rel_sources IS NULL THEN COLLECT {
         MATCH (e)-[:MENTIONS]->(a:Entity)-[r:RELATED_TO]->(b:Entity) WHERE e.id IN r.episodes
         RETURN [a.uid, b.uid, coalesce(r.predicate, 'related_to'), r.weight / coalesce(r.support, size(r.episodes)),
                 r.description]
       } END AS legacy_relationships,
       COLLECT {
         UNWIND range(0, size(coalesce(e.end_sources, [])) - 1) AS i
         MATCH (a:Entity {uid: e.end_sources[i]})-[r:RELATED_TO]->(b:Entity {uid: e.end_targets[i]})
         WHERE coalesce(r.predicate, 'related_to') = e.end_predicates[i]
         RETURN [a.key, e.end_predicates[i], b.key, CASE WHEN r.ended_by = e.id THEN r.invalid_from END] ORDER BY i
       } AS ended,
       COLLECT { MATCH (c:Chunk)-[:OF]->(e) RETURN [c.start, c.end, c.embedding] ORDER BY c.seq } AS windows
"""

ENTITIES_PAGE = """
MATCH (n:Entity {user_id: $user_id}) WHERE n.uid > $after
RETURN n.uid AS uid, n.name AS name, n.type AS type, n.description AS description, n.mentions AS mentions,
       n.first_seen AS first_seen, n.last_seen AS last_seen
ORDER BY uid LIMIT $page
"""

RELATIONSHIPS_PAGE = """
MATCH (a:Entity {user_id: $user_id})-[r:RELATED_TO]->(b:Entity)
WHERE a.uid > $after_source OR (a.uid = $after_source AND (b.uid > $after_target
      OR (b.uid = $after_target AND coalesce(r.predicate, 'related_to') > $after_predicate)))
RETURN a.uid AS source_uid, b.uid AS target_uid, a.name AS source, b.name AS target,
       coalesce(r.predicate, 'related_to') AS predicate,
       r.description AS description, r.weight AS weight, coalesce(r.support, size(r.episodes)) AS support,
       r.valid_from AS valid_from, r.invalid_from AS invalid_from, r.ended_by AS ended_by,
       coalesce(r.replaces, []) AS replaces, r.reopened_by AS reopened_by, r.before_valid_from AS before_valid_from,
       r.before_invalid_from AS before_invalid_from, r.before_ended_by AS before_ended_by
ORDER BY source_uid, target_uid, predicate LIMIT $page
"""

SESSIONS_PAGE = """
MATCH (p:SessionProgress {user_id: $user_id}) WHERE p.key > $after
RETURN p.key AS key, p.session_id AS session_id, coalesce(p.extracted, 0) AS extracted,
       coalesce(p.digest, '') AS digest, p.hashes AS hashes
ORDER BY key LIMIT $page
"""

FOREIGN = "UNWIND $ids AS id MATCH (e:Episode {id: id}) WHERE e.user_id <> $user_id RETURN e.id AS id"

# An entity whose every mention came from the import (its count is the exported one) takes the exported
# details; one the deployment already knew from its own episodes keeps its own, widened to the exported times.
RESTORE_ENTITIES = """
UNWIND $rows AS row
MATCH (n:Entity {uid: row.uid}) WHERE n.user_id = $user_id
WITH n, row, n.mentions = row.mentions AS ours
SET n.type = CASE WHEN ours THEN row.type ELSE n.type END,
    n.description = CASE WHEN ours THEN row.description ELSE n.description END,
    n.first_seen = CASE WHEN ours OR row.first_seen < n.first_seen THEN row.first_seen ELSE n.first_seen END,
    n.last_seen = CASE WHEN ours OR row.last_seen > n.last_seen THEN row.last_seen ELSE n.last_seen END
RETURN count(n) AS n
"""

# Who set each fact's current state here: an end or a reopening by an episode that is not in the file (a
# correction this deployment made after an earlier run of the import) is kept, not overwritten. And whether
# the episodes the file says ended or reopened it are stored: one forgotten while the import ran must not
# leave the fact ended by an episode that does not exist (its forget could never open it again).
FACT_AUTHORS = """
UNWIND $rows AS row
MATCH (:Entity {uid: row.source_uid})-[r:RELATED_TO {predicate: row.predicate}]->(:Entity {uid: row.target_uid})
WHERE r.user_id = $user_id
RETURN row.source_uid AS source_uid, row.predicate AS predicate, row.target_uid AS target_uid,
       r.ended_by AS ended_by, r.reopened_by AS reopened_by,
       all(id IN [x IN [row.ended_by, row.reopened_by] WHERE x IS NOT NULL]
           WHERE EXISTS { MATCH (e:Episode {id: id}) WHERE e.user_id = $user_id }) AS named_stored
"""

RESTORE_RELATIONSHIPS = """
UNWIND $rows AS row
MATCH (:Entity {uid: row.source_uid})-[r:RELATED_TO {predicate: row.predicate}]->(:Entity {uid: row.target_uid})
WHERE r.user_id = $user_id AND r.support = row.support
SET r.description = row.description, r.valid_from = coalesce(row.valid_from, r.valid_from),
    r.invalid_from = row.invalid_from, r.ended_by = row.ended_by,
    r.replaces = CASE WHEN size(row.replaces) = 0 THEN null ELSE row.replaces END,
    r.reopened_by = row.reopened_by, r.before_valid_from = row.before_valid_from,
    r.before_invalid_from = row.before_invalid_from, r.before_ended_by = row.before_ended_by
RETURN count(r) AS n
"""

# A session forgotten after the import was accepted stays forgotten (its line would make a later send of it
# count as extracted); read under the user's lock, which a forget takes too.
RESTORE_PROGRESS = """
UNWIND $rows AS row
WITH row WHERE NOT EXISTS { MATCH (t:Forgotten {key: row.tombstone}) WHERE t.at >= $accepted_at }
MERGE (p:SessionProgress {key: row.key})
ON CREATE SET p.user_id = $user_id, p.session_id = row.session_id, p.extracted = 0, p.digest = ''
WITH p, row WHERE p.user_id = $user_id AND row.extracted > p.extracted
SET p.extracted = row.extracted, p.digest = row.digest, p.hashes = row.hashes, p.updated_at = $now
RETURN count(p) AS n
"""


class Portability(StorePart):
    """export_* and restore_* of Neo4jGraphStore, which gives the sessions and write transactions."""

    def export_counts(self, user_id: str) -> dict[str, int]:
        with translated("export"), self._read_session() as session:
            return dict(session.run(COUNTS, user_id=user_id).single(strict=True))

    def _pages(self, statement: str, user_id: str, page: int, after: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Every row of a paged statement; `after` holds its cursor's parameters, named as the returned
        columns that set them (`after_source` ← `source_uid`...)."""
        cursor = dict(after)
        while True:
            with translated("export"), self._read_session() as session:
                rows = [native(dict(r)) for r in session.run(statement, {"user_id": user_id, "page": page, **cursor})]
            yield from rows
            if len(rows) < page:
                return
            last = rows[-1]
            cursor = {name: last[column] for name, column in _CURSOR_COLUMNS[statement].items()}

    def export_episodes(self, user_id: str, page: int = 50) -> Iterator[dict[str, Any]]:
        """Pages of 50: an episode may hold 200,000 characters and an embedding per message."""
        yield from self._pages(EPISODES_PAGE, user_id, page, {"after_at": FIRST_TIME, "after": ""})

    def export_entities(self, user_id: str, page: int = 1_000) -> Iterator[dict[str, Any]]:
        yield from self._pages(ENTITIES_PAGE, user_id, page, {"after": ""})

    def export_relationships(self, user_id: str, page: int = 1_000) -> Iterator[dict[str, Any]]:
        after = {"after_source": "", "after_target": "", "after_predicate": ""}
        yield from self._pages(RELATIONSHIPS_PAGE, user_id, page, after)

    def export_sessions(self, user_id: str, page: int = 1_000) -> Iterator[dict[str, Any]]:
        yield from self._pages(SESSIONS_PAGE, user_id, page, {"after": ""})

    def foreign_episodes(self, user_id: str, ids: list[str]) -> list[str]:
        """Which of these episode ids are stored for another user (an import must not touch them)."""
        with translated("import"), self._read_session() as session:
            return [r["id"] for r in session.run(FOREIGN, ids=ids, user_id=user_id)]

    def restore(
        self,
        kind: str,
        user_id: str,
        rows: list[dict[str, Any]],
        accepted_at: float,
        authors: Collection[str] = frozenset(),
    ) -> int:
        """kind: entity, relationship or session; rows built by api_stub/portability.py. Idempotent. Under
        the user's lock, as a persist: when the user was erased after the import was accepted (or is being
        erased), nothing is written and StoreRequestError (cause ErasedDuringImport) is raised; a session
        forgotten since then keeps no progress line. authors: the file's episode ids; a relationship whose
        end or reopening here was made by another episode keeps its state."""
        statement = _RESTORES[kind]
        if not rows:
            return 0
        if kind == "session":
            rows = [{**row, "tombstone": session_tombstone(row["key"])} for row in rows]
        now = datetime.now(UTC)

        def work(tx: ManagedTransaction) -> int:
            mark = tx.run(cypher.LOCK_USERS, tags=[user_tag(user_id)], now=time.time()).single(strict=True)
            if erased_since(accepted_at, float(mark["erased_at"])) or float(mark["erasing_until"]) > time.time():
                raise StoreRequestError("the user was erased while the import ran", cause="ErasedDuringImport")
            todo = _by_file_authors(tx, rows, user_id, authors) if kind == "relationship" else rows
            result = tx.run(statement, rows=todo, user_id=user_id, now=now, accepted_at=accepted_at)
            return int(result.single(strict=True)["n"])

        with translated("import"), self._session() as session:
            return self._write(session, work, bulk=True)


def _by_file_authors(
    tx: ManagedTransaction, rows: list[dict[str, Any]], user_id: str, authors: Collection[str]
) -> list[dict[str, Any]]:
    """The relationship rows whose stored state no episode outside the file set, and whose own end or
    reopening names stored episodes (see FACT_AUTHORS)."""
    kept = {
        (r["source_uid"], r["predicate"], r["target_uid"])
        for r in tx.run(FACT_AUTHORS, rows=rows, user_id=user_id)
        if r["named_stored"] and all(by is None or by in authors for by in (r["ended_by"], r["reopened_by"]))
    }
    return [row for row in rows if (row["source_uid"], row["predicate"], row["target_uid"]) in kept]


_RESTORES = {"entity": RESTORE_ENTITIES, "relationship": RESTORE_RELATIONSHIPS, "session": RESTORE_PROGRESS}

_CURSOR_COLUMNS: dict[str, dict[str, str]] = {
    EPISODES_PAGE: {"after_at": "at", "after": "id"},
    ENTITIES_PAGE: {"after": "uid"},
    RELATIONSHIPS_PAGE: {"after_source": "source_uid", "after_target": "target_uid", "after_predicate": "predicate"},
    SESSIONS_PAGE: {"after": "key"},
}
