"""Forget one episode or one session of a user: the transaction that removes them from the graph.

What an episode added is taken back exactly:
- each entity it mentions loses one mention (its MENTIONS edge goes); an entity no episode mentions any more
  is deleted, and one that stays takes the description of the latest remaining episode that gave one (none:
  empty, so no words of the forgotten episode stay);
- each relationship it supported loses the weight the episode added and the episode's id, recorded on the
  episode when it was saved (`rel_sources`, `rel_targets`, `rel_weights`, `rel_descriptions`); a relationship
  no episode supports any more (`support` 0) is deleted, one that stays takes the description of the latest
  remaining episode that gave one (none: empty); the known facts it ended are current again
  (worker/graph/facts.py). Episodes saved before these records existed give back an
  equal share of the weight (weight / support) instead, and a relationship from before the support counter
  starts it from its list of episode ids, which keeps only the last 50;
- its search windows (Chunk) and the episode itself go;
- the session's extraction progress goes when no episode of the session remains (forget_session: always),
  so a later send of the session is extracted again; the session is then tombstoned too, so that a send of
  it accepted before the forget and not yet stored (it may hold the forgotten messages) is dropped. While
  other episodes of the session remain, the line stays: a send of the same history, earlier or later, does
  not bring the forgotten messages back (they count as extracted).

A tombstone (:Forgotten {key, at}) is written in the same transaction, under the user's lock that persist
transactions take too: work for that episode (or session) accepted before `at` (queued, retrying, a
redelivered message) is dropped by the extract stage and by the persist transaction, so a forget after an
add wins whatever the order in which the workers get to it. A send accepted after the forget is new memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neo4j import ManagedTransaction

from worker.facts_text import DEFAULT_PREDICATE
from worker.graph.facts import FORGET_OWN_ENDS, REOPEN_FACTS, UNDO_REOPENINGS, UNLIST_REPLACED
from worker.graph.params import fact_key
from worker.identity import user_tag
from worker.sessions import progress_key


@dataclass(frozen=True)
class ForgetCounts:
    episodes: int
    entities_removed: int
    entities_updated: int
    relationships_removed: int
    relationships_updated: int
    session_progress: int
    tombstones: tuple[str, ...]  # what was tombstoned (mirrored in Redis for the dead-letter path)
    session_forgotten: str | None  # the session tombstoned, when it was (its pending sends go too)


def episode_tombstone(user_id: str, episode_id: str) -> str:
    return f"episode:{user_tag(user_id)}:{episode_id}"


def session_tombstone(session_key: str) -> str:
    """session_key: the session's progress key (worker/sessions.py progress_key)."""
    return f"session:{session_key}"


def tombstones(user_id: str, episode_id: str, session_id: str | None) -> list[str]:
    """The tombstones that drop work for this episode: its own, and its session's (when known)."""
    keys = [episode_tombstone(user_id, episode_id)]
    if session_id:
        keys.append(session_tombstone(progress_key(user_id, session_id)))
    return keys


LOCK_USER = "MERGE (u:UserMark {user_tag: $tag}) ON CREATE SET u.erased_at = 0.0 SET u.locked_at = $at"

# A send accepted after the forget is new memory: it is never what is forgotten (the forget may have waited
# for the user's lock while it was written).
OWNER = """
MATCH (e:Episode {id: $episode_id})
RETURN e.user_id AS user_id, e.session_id AS session_id, coalesce(e.accepted_at, 0.0) > $at AS newer
"""

SESSION_EPISODES = """
MATCH (e:Episode {user_id: $user_id, session_id: $session_id}) WHERE coalesce(e.accepted_at, 0.0) <= $at
RETURN e.id AS id ORDER BY id
"""

REMAINING = "RETURN EXISTS { MATCH (e:Episode {user_id: $user_id, session_id: $session_id}) } AS remaining"

TOMBSTONE = """
UNWIND $keys AS key
MERGE (t:Forgotten {key: key})
ON CREATE SET t.user_id = $user_id, t.at = $at
SET t.at = CASE WHEN t.at > $at THEN t.at ELSE $at END
"""

# Relationships the episodes supported, with what each added (recorded at save) or, for an episode saved
# before those records, an equal share of the weight.
TAKE_BACK_RELATIONSHIPS = """
UNWIND $ids AS id
MATCH (e:Episode {id: id}) WHERE e.user_id = $user_id
CALL (e) {
  WITH e WHERE e.rel_sources IS NOT NULL
  UNWIND range(0, size(e.rel_sources) - 1) AS i
  MATCH (:Entity {uid: e.rel_sources[i]})-[r:RELATED_TO]->(:Entity {uid: e.rel_targets[i]})
  // saved before predicates (the episode, or the relationship): the default
  WHERE coalesce(r.predicate, $default_predicate) = coalesce(e.rel_predicates[i], $default_predicate)
  RETURN r, e.rel_weights[i] AS given
  UNION
  WITH e WHERE e.rel_sources IS NULL
  MATCH (:Entity {user_id: $user_id})-[r:RELATED_TO]->() WHERE e.id IN r.episodes
  RETURN r, r.weight / coalesce(r.support, size(r.episodes)) AS given
}
WITH r, collect(id) AS ids, sum(given) AS given, count(*) AS times
WITH r, ids, given, times, coalesce(r.support, size(r.episodes)) AS support
SET r.weight = CASE WHEN support <= times THEN 0.0 ELSE r.weight - given END,
    r.support = support - times,
    r.episodes = [x IN r.episodes WHERE NOT x IN ids]
RETURN elementId(r) AS rid, support - times <= 0 AS gone, startNode(r).key AS source_key,
       coalesce(r.predicate, $default_predicate) AS predicate, endNode(r).key AS target_key,
       startNode(r).uid AS source_uid, endNode(r).uid AS target_uid
"""

DELETE_RELATIONSHIPS = "UNWIND $rids AS rid MATCH ()-[r]->() WHERE elementId(r) = rid DELETE r"

# A remaining relationship's description: the latest remaining episode (of its list) that gave one; none
# (or only episodes saved before these records): '' so that no words of a forgotten episode stay.
REDESCRIBE_RELATIONSHIPS = """
UNWIND $rids AS rid
MATCH (a)-[r]->(b) WHERE elementId(r) = rid
OPTIONAL CALL (r, a, b) {
  UNWIND range(size(r.episodes) - 1, 0, -1) AS j
  MATCH (o:Episode {id: r.episodes[j]})
  WHERE o.rel_sources IS NOT NULL
  UNWIND range(0, size(o.rel_sources) - 1) AS i
  WITH j, o, i WHERE o.rel_sources[i] = a.uid AND o.rel_targets[i] = b.uid AND o.rel_descriptions[i] <> ''
                 AND coalesce(o.rel_predicates[i], $default_predicate) = coalesce(r.predicate, $default_predicate)
  RETURN o.rel_descriptions[i] AS description
  ORDER BY j DESC
  LIMIT 1
}
SET r.description = coalesce(description, '')
"""

TAKE_BACK_MENTIONS = """
UNWIND $ids AS id
MATCH (e:Episode {id: id})-[m:MENTIONS]->(n:Entity) WHERE e.user_id = $user_id
DELETE m
WITH n, count(*) AS times
SET n.mentions = n.mentions - times
WITH n
OPTIONAL CALL (n) {
  MATCH (o:Episode)-[m:MENTIONS]->(n) WHERE coalesce(m.description, '') <> ''
  RETURN m.description AS description
  ORDER BY o.created_at DESC, o.id DESC
  LIMIT 1
}
WITH n, description, NOT EXISTS { (:Episode)-[:MENTIONS]->(n) } AS gone
SET n.description = CASE WHEN gone THEN n.description ELSE coalesce(description, '') END
WITH n, gone
CALL (n, gone) {
  WITH n WHERE gone
  DETACH DELETE n
}
RETURN count(CASE WHEN gone THEN 1 END) AS removed, count(CASE WHEN NOT gone THEN 1 END) AS updated
"""

DELETE_EPISODES = """
UNWIND $ids AS id
MATCH (e:Episode {id: id}) WHERE e.user_id = $user_id
OPTIONAL MATCH (c:Chunk)-[:OF]->(e)
DETACH DELETE c
WITH DISTINCT e
DETACH DELETE e
RETURN count(*) AS n
"""

DELETE_PROGRESS = """
MATCH (p:SessionProgress {key: $key}) WHERE p.user_id = $user_id
DELETE p
RETURN count(*) AS n
"""


def take_back_relationships(
    tx: ManagedTransaction, ids: list[str], user_id: str, *, reopen: bool = True
) -> tuple[list[dict[str, Any]], list[str]]:
    """Take back what the episodes added to relationships, deleting those nothing supports any more, and undo
    what they did to facts (worker/graph/facts.py). With `reopen` (a forget): the facts they ended are current
    again, and a deleted fact is no longer listed in other facts' `replaces`; without (a re-extraction, which
    may say a deleted fact again), that is the caller's. Returns the deleted facts (rid, key, ends: (source
    uid, predicate, target uid)) and the kept relationships' element ids."""
    if not ids:
        return [], []
    facts = {"ids": ids, "user_id": user_id, "default_predicate": DEFAULT_PREDICATE}
    tx.run(UNDO_REOPENINGS, facts).consume()
    if reopen:
        tx.run(FORGET_OWN_ENDS, facts).consume()
        tx.run(REOPEN_FACTS, facts).consume()
    rows = list(tx.run(TAKE_BACK_RELATIONSHIPS, facts))
    gone = [
        {
            "rid": r["rid"],
            "key": fact_key(r["source_key"], r["predicate"], r["target_key"]),
            "ends": (r["source_uid"], r["predicate"], r["target_uid"]),
        }
        for r in rows
        if r["gone"]
    ]
    if gone:
        tx.run(DELETE_RELATIONSHIPS, rids=[g["rid"] for g in gone]).consume()
        if reopen:
            unlist_replaced(tx, user_id, [g["key"] for g in gone])
    return gone, [r["rid"] for r in rows if not r["gone"]]


def unlist_replaced(tx: ManagedTransaction, user_id: str, keys: list[str]) -> None:
    if keys:
        tx.run(UNLIST_REPLACED, user_id=user_id, keys=keys).consume()


def redescribe_relationships(tx: ManagedTransaction, rids: list[str]) -> None:
    tx.run(REDESCRIBE_RELATIONSHIPS, rids=rids, default_predicate=DEFAULT_PREDICATE).consume()


def forget_transaction(
    tx: ManagedTransaction, user_id: str, at: float, episode_id: str | None, session_id: str | None
) -> ForgetCounts:
    """Exactly one of episode_id and session_id. An episode id stored for another user is left alone and
    answered as an unknown id: the caller learns nothing about it (a derived id hashes the user, session and
    messages, so telling it apart would confirm a guessed conversation)."""
    tx.run(LOCK_USER, tag=user_tag(user_id), at=at).consume()
    if episode_id is not None:
        owner = tx.run(OWNER, episode_id=episode_id, at=at).single()
        if owner is not None and owner["user_id"] != user_id:
            owner = None
        found = owner is not None and not owner["newer"]
        ids = [episode_id] if found else []
        keys = [episode_tombstone(user_id, episode_id)]
        session_of = str(owner["session_id"]) if owner is not None and found else None
    else:
        assert session_id is not None
        ids = [r["id"] for r in tx.run(SESSION_EPISODES, user_id=user_id, session_id=session_id, at=at)]
        keys = [session_tombstone(progress_key(user_id, session_id))]
        session_of = session_id
    gone, kept = take_back_relationships(tx, ids, user_id)
    mentions = tx.run(TAKE_BACK_MENTIONS, ids=ids, user_id=user_id).single(strict=True)
    episodes = int(tx.run(DELETE_EPISODES, ids=ids, user_id=user_id).single(strict=True)["n"]) if ids else 0
    if kept:
        redescribe_relationships(tx, kept)
    progress = 0
    session_forgotten = session_id
    if session_of is not None:
        last = (
            session_id is not None
            or not tx.run(REMAINING, user_id=user_id, session_id=session_of).single(strict=True)["remaining"]
        )
        if last:  # the session's line goes, and with it the sends of the session accepted before now
            if session_id is None:
                keys.append(session_tombstone(progress_key(user_id, session_of)))
                session_forgotten = session_of
            key = progress_key(user_id, session_of)
            progress = int(tx.run(DELETE_PROGRESS, key=key, user_id=user_id).single(strict=True)["n"])
    tx.run(TOMBSTONE, keys=keys, user_id=user_id, at=at).consume()
    return ForgetCounts(
        episodes=episodes,
        entities_removed=int(mentions["removed"]),
        entities_updated=int(mentions["updated"]),
        relationships_removed=len(gone),
        relationships_updated=len(kept),
        session_progress=progress,
        tombstones=tuple(keys),
        session_forgotten=session_forgotten,
    )
