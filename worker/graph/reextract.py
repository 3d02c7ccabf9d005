"""Re-extraction in the graph: which stored episodes to extract again, and the transaction that puts a new
extraction in place of an episode's old one.

The replacement takes back exactly what the episode added (its mentions, the weight and support it gave
each relationship: the same statements as forgetting it, worker/graph/forget.py), then writes what the new
extraction adds (the same statements as saving it) and the episode's new summary, terms and extraction
details. Its content, times, session and search windows stay. One transaction, under the user's lock:
other episodes' contributions are never touched, and counts stay exact. Each re-extraction carries a job id
recorded on the episode, so a redelivered or replayed one finds it applied and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from neo4j import ManagedTransaction

from worker.errors import StoreRequestError
from worker.facts_text import DEFAULT_PREDICATE
from worker.graph.errors import translated
from worker.graph.facts import FACT_STATES, RESTORE_FACT_STATES
from worker.graph.forget import (
    TAKE_BACK_MENTIONS,
    redescribe_relationships,
    take_back_relationships,
    unlist_replaced,
)
from worker.graph.params import EpisodeWrite, build_save_params
from worker.graph.parts import StorePart
from worker.graph.save_tx import counted
from worker.graph.values import native
from worker.graph.write_checks import check_writes
from worker.models import Entity, EpisodeRecord, Relationship, SaveResult

# Stored episodes in pages by id, with what re-extraction needs to choose and to plan them.
_SELECT = """
MATCH (e:Episode) WHERE {where} e.id > $after
RETURN e.id AS id, e.user_id AS user_id, e.session_id AS session_id, e.content AS content,
       e.occurred_at AS occurred_at, e.extraction AS extraction, coalesce(e.prompt_version, '') AS prompt_version,
       coalesce(e.completion_tokens, 0) AS completion_tokens
ORDER BY e.id LIMIT $page
"""
SELECT_USER = _SELECT.format(where="e.user_id = $user_id AND")
SELECT_ALL = _SELECT.format(where="")

STORED = """
MATCH (e:Episode {id: $id})
RETURN e.user_id AS user_id, e.reextracted_by AS job, coalesce(e.reextract_accepted_at, 0.0) AS accepted_at,
       e.extraction AS extraction, e.created_at AS created_at, e.occurred_at AS occurred_at,
       e.accepted_at AS episode_accepted_at
"""

# What the new extraction adds, as saving does, except what depends on when: an entity created now was first
# and last seen when its episode was stored; descriptions are chosen again by time below.
REPLACE_ENTITIES = """
UNWIND $rows AS row
MATCH (e:Episode {id: row.episode_id})
MERGE (n:Entity {uid: row.uid})
ON CREATE SET n.user_id = row.user_id, n.user_tag = row.user_tag, n.key = row.key, n.name = row.name,
              n.type = row.type, n.description = '', n.first_seen = e.created_at, n.last_seen = e.created_at,
              n.mentions = 0
SET n.mentions = n.mentions + 1,
    n.type = CASE WHEN n.type = 'other' THEN row.type ELSE n.type END,
    n.first_seen = CASE WHEN e.created_at < n.first_seen THEN e.created_at ELSE n.first_seen END,
    n.last_seen = CASE WHEN e.created_at > n.last_seen THEN e.created_at ELSE n.last_seen END
MERGE (e)-[m:MENTIONS]->(n)
SET m.description = row.description
RETURN row.episode_id AS id, count(n) AS n
"""

# The relationship's episode list stays in the order its episodes were stored (the re-extracted one goes back
# to its place, not to the end).
REPLACE_RELATIONSHIPS = """
UNWIND $rows AS row
MATCH (a:Entity {uid: row.source_uid})
MATCH (b:Entity {uid: row.target_uid})
MERGE (a)-[r:RELATED_TO {predicate: row.predicate}]->(b)
ON CREATE SET r.user_id = row.user_id, r.weight = 0.0, r.episodes = [], r.description = '',
              r.valid_from = row.valid_from
SET r.support = coalesce(r.support, size(r.episodes)) + 1, r.weight = r.weight + row.weight,
    r.valid_from = CASE WHEN r.valid_from IS NULL OR row.valid_from < r.valid_from THEN row.valid_from
                        ELSE r.valid_from END
WITH r, row
CALL (r, row) {
  UNWIND r.episodes + row.episode_id AS id
  OPTIONAL MATCH (o:Episode {id: id})
  WITH id, o WHERE o IS NOT NULL OR id = row.episode_id  // ids of episodes gone since: dropped
  WITH id, o ORDER BY o.created_at, id
  RETURN collect(id)[-50..] AS ordered
}
SET r.episodes = ordered
RETURN row.episode_id AS id, count(r) AS n, collect(elementId(r)) AS rids
"""

# An entity's description: the latest episode (by when it was stored) that gave one, as forgetting chooses.
REDESCRIBE_ENTITIES = """
UNWIND $uids AS uid
MATCH (n:Entity {uid: uid})
OPTIONAL CALL (n) {
  MATCH (o:Episode)-[m:MENTIONS]->(n) WHERE coalesce(m.description, '') <> ''
  RETURN m.description AS description
  ORDER BY o.created_at DESC, o.id DESC
  LIMIT 1
}
SET n.description = coalesce(description, '')
"""


# What an extraction sets on its episode; the rest of the episode (content, times, ids) stays.
_REPLACED = (
    "summary",
    "extraction",
    "model",
    "prompt_version",
    "llm_calls",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "dropped_entities",
    "dropped_relationships",
    "windows",
    "message_count",
    "rel_sources",
    "rel_targets",
    "rel_weights",
    "rel_descriptions",
    "rel_predicates",
    "terms",
)

SET_EXTRACTION = """
MATCH (e:Episode {id: $id})
SET e += $fields, e.reextracted_by = $job, e.reextracted_at = $now,
    e.reextract_accepted_at = coalesce($accepted_at, e.reextract_accepted_at)
"""


def replace_transaction(tx: ManagedTransaction, write: EpisodeWrite, job: str, now: datetime) -> SaveResult:
    """outcome: created (replaced now), exists (this job or a later one already replaced it, or the new
    extraction is degraded where the stored one is not: that one is kept), forgotten (the episode is gone,
    or its user erased or it forgotten after the re-extraction was asked for), erasing (try again later)."""
    record = write[0]
    refused = check_writes(tx, [write], {})
    if refused:
        return SaveResult(episode_id=record.id, created=False, outcome=refused[record.id])
    stored = tx.run(STORED, id=record.id).single()
    if stored is None:
        return SaveResult(episode_id=record.id, created=False, outcome="forgotten")
    if stored["user_id"] != record.user_id:
        raise StoreRequestError(f"episode {record.id} belongs to another user", cause="ForeignEpisode")
    if stored["job"] == job or (record.accepted_at or 0.0) < float(stored["accepted_at"]):
        return SaveResult(episode_id=record.id, created=False, outcome="exists")  # this run, or a later one, is in
    if record.extraction == "degraded" and stored["extraction"] != "degraded":
        return SaveResult(episode_id=record.id, created=False, outcome="exists")  # never trade memory for nothing
    ids, user_id = [record.id], record.user_id
    facts = [dict(r) for r in tx.run(FACT_STATES, id=record.id, default_predicate=DEFAULT_PREDICATE)]
    gone, kept = take_back_relationships(tx, ids, user_id, reopen=False)
    tx.run(TAKE_BACK_MENTIONS, ids=ids, user_id=user_id).consume()
    # The new facts hold from the episode's own time (occurred, accepted, stored), not from today.
    timed = record.model_copy(
        update={
            "created_at": stored["created_at"].to_native(),
            "occurred_at": stored["occurred_at"].to_native() if stored["occurred_at"] is not None else None,
            "accepted_at": stored["episode_accepted_at"],
        }
    )
    params = build_save_params([(timed, write[1], write[2])])
    fields = {k: params.episodes[0][k] for k in _REPLACED}
    tx.run(SET_EXTRACTION, id=record.id, fields=fields, job=job, now=now, accepted_at=record.accepted_at).consume()
    n_entities = counted(tx, REPLACE_ENTITIES, params.entities, now).get(record.id, 0)
    added = list(tx.run(REPLACE_RELATIONSHIPS, rows=params.relationships)) if params.relationships else []
    n_relationships = sum(int(r["n"]) for r in added)
    said = {(r["source_uid"], r["predicate"], r["target_uid"]) for r in params.relationships}
    again = [f for f in facts if (f["source_uid"], f["predicate"], f["target_uid"]) in said]
    if again:  # a fact the new extraction says again is as it was (times, end, reopening), even if deleted
        tx.run(RESTORE_FACT_STATES, rows=again).consume()
    unlist_replaced(tx, user_id, [g["key"] for g in gone if g["ends"] not in said])  # deleted for good
    touched = sorted(set(kept) | {rid for r in added for rid in r["rids"]})
    if touched:
        redescribe_relationships(tx, touched)
    # those only taken back were described again by TAKE_BACK_MENTIONS; those it adds mentions to are now
    uids = sorted({row["uid"] for row in params.entities})
    if uids:
        tx.run(REDESCRIBE_ENTITIES, uids=uids).consume()
    return SaveResult(
        episode_id=record.id, created=True, entities=n_entities, relationships=n_relationships, outcome="created"
    )


class Reextraction(StorePart):
    """episodes_to_reextract and replace_extraction of Neo4jGraphStore, which gives sessions and transactions."""

    def episodes_to_reextract(self, user_id: str | None, page: int = 500) -> Iterator[dict[str, Any]]:
        """Stored episodes of one user (or of all), in pages by id; the caller filters them."""
        after = ""
        while True:
            params = {"after": after, "page": page, "user_id": user_id}
            with translated("reextract"), self._read_session() as session:
                rows = [native(dict(r)) for r in session.run(SELECT_ALL if user_id is None else SELECT_USER, params)]
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1]["id"]

    def replace_extraction(
        self, record: EpisodeRecord, entities: Sequence[Entity], relationships: Sequence[Relationship], job: str
    ) -> SaveResult:
        """Put a new extraction in place of the stored episode's (see the module's notes)."""
        now = datetime.now(UTC)
        with translated("replace_extraction"), self._session() as session:
            return self._write(session, replace_transaction, (record, entities, relationships), job, now)
