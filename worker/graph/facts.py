"""Facts that change over time in the graph: the current facts offered to the extraction, the statement that
ends the facts an episode's extraction ended, the one that opens them again when that episode is forgotten,
and the upgrade that gives relationships stored before predicates existed the default one.

A relationship (:Entity)-[:RELATED_TO {predicate}]->(:Entity) is one fact, keyed by its ends and predicate.
`valid_from`: when it became true (the conversation's date, else its episode's time; the earliest when
several episodes say it); `invalid_from`: when it stopped (null while current), set by the episode named in
`ended_by`; the fact that replaced it lists it in `replaces` (JSON [source key, predicate, target key]).
Nothing is deleted for being out of date: recall marks it, and answers `as_of` a time.
"""

from __future__ import annotations

from typing import Any

from worker.facts_text import DEFAULT_PREDICATE
from worker.graph.cypher import ENTITY_FULLTEXT
from worker.graph.errors import translated
from worker.graph.lucene import build_query, content_terms
from worker.graph.parts import StorePart
from worker.graph.values import native
from worker.identity import entity_key, entity_uid, user_tag

SELF = "user"  # the entity the extraction prompt names the user by

# The user's current facts about the entities the new messages name (fulltext over entity names), and the
# user's own (the "user" entity), at most $limit: the latest updated of each kind (source and predicate) first,
# then the second latest of each, and so on, so that many newer facts of one kind ("user likes …") never crowd
# out the one fact of another ("user lives_in Porto") a new message may end.
_SEEDS_NAMED = f"""
CALL () {{
  CALL db.index.fulltext.queryNodes('{ENTITY_FULLTEXT}', $entity_query, {{limit: $k}}) YIELD node
  WHERE node.user_id = $user_id
  RETURN collect(node) AS named
}}
"""
_SEEDS_NONE = "WITH [] AS named\n"
_FACTS = """
OPTIONAL MATCH (me:Entity {uid: $self_uid})
UNWIND named + CASE WHEN me IS NULL THEN [] ELSE [me] END AS n
MATCH (n)-[r:RELATED_TO]-()
WHERE r.user_id = $user_id AND coalesce(r.invalid_from > datetime(), true)  // ending later is still current
WITH DISTINCT r
WITH r, startNode(r) AS a, endNode(r) AS b, coalesce(r.updated_at, r.valid_from) AS at
ORDER BY at DESC, a.uid, r.predicate, b.uid
WITH a.uid AS source, r.predicate AS predicate, collect({r: r, a: a, b: b, at: at}) AS kind
UNWIND range(0, size(kind) - 1) AS rank
WITH kind[rank] AS f, rank
ORDER BY rank, f.at DESC, f.a.uid, f.r.predicate, f.b.uid
LIMIT $limit
RETURN f.a.key AS source_key, f.a.name AS source, f.r.predicate AS predicate, f.b.key AS target_key,
       f.b.name AS target, f.r.valid_from AS valid_from
"""
CURRENT_FACTS = _SEEDS_NAMED + _FACTS
CURRENT_FACTS_OF_USER = _SEEDS_NONE + _FACTS

# In the save transaction, after the episodes' own relationships (an import saves the fact and the episode
# that ended it in one batch): a fact still current, that started no later than the end, ends, and the fact
# that replaces it (when one does) lists it in `replaces`. A fact gone (forgotten) or already ended is left
# as it is. A predicate of null: stored by a version before predicates.
END_FACTS = """
UNWIND $rows AS row
CALL (row) {
  MATCH (:Entity {uid: row.source_uid})-[r:RELATED_TO]->(:Entity {uid: row.target_uid})
  WHERE r.user_id = row.user_id AND coalesce(r.predicate, $default_predicate) = row.predicate
    AND r.invalid_from IS NULL AND coalesce(r.valid_from <= row.at, true)
  SET r.invalid_from = row.at, r.ended_by = row.episode_id
  WITH row WHERE row.by_source_uid IS NOT NULL
  MATCH (:Entity {uid: row.by_source_uid})-[n:RELATED_TO]->(:Entity {uid: row.by_target_uid})
  WHERE coalesce(n.predicate, $default_predicate) = row.by_predicate AND NOT row.key IN coalesce(n.replaces, [])
  SET n.replaces = coalesce(n.replaces, []) + row.key
}
"""

# Forgetting an episode takes back what it did to facts, in this order (when a session is forgotten, a fact
# one of its episodes ended and a later one made current again is first put back as ended, then opened):
# - UNDO_REOPENINGS: a fact it made current again is put back as it was (its before_* go); its facts no
#   longer list in `replaces` what its ends that applied ended (a re-extraction runs this step alone, before
#   it puts back the state of the facts its new extraction says again);
# - FORGET_OWN_ENDS: a fact whose earlier end (kept when it was made current again) was its own was never
#   ended: it holds from its earlier valid_from, and there is no reopening to remember;
# - REOPEN_FACTS: the facts it ended are current again.
UNDO_REOPENINGS = """
UNWIND $ids AS id
MATCH (e:Episode {id: id}) WHERE e.user_id = $user_id
CALL (e) {  // the ends of this episode that applied (an end of a fact already ended put nothing in replaces)
  UNWIND range(0, size(coalesce(e.end_sources, [])) - 1) AS i
  MATCH (:Entity {uid: e.end_sources[i]})-[r:RELATED_TO]->(:Entity {uid: e.end_targets[i]})
  WHERE coalesce(r.predicate, $default_predicate) = e.end_predicates[i] AND r.ended_by = e.id
  RETURN collect(e.end_keys[i]) AS applied
}
CALL (e, applied) {
  UNWIND range(0, size(coalesce(e.rel_sources, [])) - 1) AS i
  MATCH (:Entity {uid: e.rel_sources[i]})-[r:RELATED_TO]->(:Entity {uid: e.rel_targets[i]})
  WHERE coalesce(r.predicate, $default_predicate) = coalesce(e.rel_predicates[i], $default_predicate)
  WITH DISTINCT r, e, applied
  WITH r, e.id = r.reopened_by AS undo, [k IN coalesce(r.replaces, []) WHERE NOT k IN applied] AS kept
  SET r.replaces = CASE WHEN size(kept) = 0 THEN null ELSE kept END,
      r.valid_from = CASE WHEN undo THEN r.before_valid_from ELSE r.valid_from END,
      r.invalid_from = CASE WHEN undo THEN r.before_invalid_from ELSE r.invalid_from END,
      r.ended_by = CASE WHEN undo THEN r.before_ended_by ELSE r.ended_by END
  WITH r, undo WHERE undo
  REMOVE r.reopened_by, r.before_valid_from, r.before_invalid_from, r.before_ended_by
}
"""
FORGET_OWN_ENDS = """
UNWIND $ids AS id
MATCH (e:Episode {id: id}) WHERE e.user_id = $user_id
CALL (e) {
  UNWIND range(0, size(coalesce(e.end_sources, [])) - 1) AS i
  MATCH (:Entity {uid: e.end_sources[i]})-[r:RELATED_TO]->(:Entity {uid: e.end_targets[i]})
  WHERE coalesce(r.predicate, $default_predicate) = e.end_predicates[i] AND r.before_ended_by = e.id
  SET r.valid_from = coalesce(r.before_valid_from, r.valid_from)
  REMOVE r.reopened_by, r.before_valid_from, r.before_invalid_from, r.before_ended_by
}
"""
REOPEN_FACTS = """
UNWIND $ids AS id
MATCH (e:Episode {id: id}) WHERE e.user_id = $user_id
UNWIND range(0, size(coalesce(e.end_sources, [])) - 1) AS i
MATCH (:Entity {uid: e.end_sources[i]})-[r:RELATED_TO]->(:Entity {uid: e.end_targets[i]})
WHERE coalesce(r.predicate, $default_predicate) = e.end_predicates[i] AND r.ended_by = e.id
SET r.invalid_from = null, r.ended_by = null
"""

# A fact deleted (no episode supports it any more) is no longer listed as replaced by any other.
UNLIST_REPLACED = """
MATCH (:Entity {user_id: $user_id})-[n:RELATED_TO]->()
WHERE n.replaces IS NOT NULL AND any(k IN n.replaces WHERE k IN $keys)
WITH n, [k IN n.replaces WHERE NOT k IN $keys] AS kept
SET n.replaces = CASE WHEN size(kept) = 0 THEN null ELSE kept END
"""

# A re-extraction takes back what its episode added (a fact only it supported, or an entity only it mentions,
# is deleted; what it did to facts is undone) and then adds the new extraction: the facts the episode
# supported are put back exactly as they were (times, end, what they replaced, a reopening) when the new
# extraction says them again.
FACT_STATES = """
MATCH (e:Episode {id: $id})
UNWIND range(0, size(coalesce(e.rel_sources, [])) - 1) AS i
MATCH (a:Entity {uid: e.rel_sources[i]})-[r:RELATED_TO]->(b:Entity {uid: e.rel_targets[i]})
WHERE coalesce(r.predicate, $default_predicate) = coalesce(e.rel_predicates[i], $default_predicate)
RETURN a.uid AS source_uid, b.uid AS target_uid, coalesce(r.predicate, $default_predicate) AS predicate,
       r {.valid_from, .invalid_from, .ended_by, .replaces, .reopened_by, .before_valid_from, .before_invalid_from,
          .before_ended_by} AS state
"""
RESTORE_FACT_STATES = """
UNWIND $rows AS row
MATCH (:Entity {uid: row.source_uid})-[r:RELATED_TO {predicate: row.predicate}]->(:Entity {uid: row.target_uid})
SET r += row.state
"""

# Relationships stored before predicates: the default predicate, once (a mark records that it ran).
# One row however many marks: processes starting together on a new database may each MERGE one (no constraint
# orders them), and a doubled mark must not fail every later start.
PREDICATES_DONE = "MATCH (m:SchemaMark {name: 'relationship_predicates'}) RETURN count(m) > 0 AS done"
SET_PREDICATES = f"""
MATCH ()-[r:RELATED_TO]->() WHERE r.predicate IS NULL
CALL (r) {{ SET r.predicate = '{DEFAULT_PREDICATE}' }} IN TRANSACTIONS OF 10000 ROWS
"""
MARK_PREDICATES = "MERGE (m:SchemaMark {name: 'relationship_predicates'}) SET m.at = datetime()"


def fact_query(user_id: str, text: str, max_terms: int = 64) -> str | None:
    """The fulltext query over entity names for the words of the new messages (function words left out)."""
    words = list(dict.fromkeys(content_terms(text).split()))[:max_terms]
    return build_query(user_tag(user_id), [], " ".join(words), max_text_chars=2_000)


class KnownFactsReader(StorePart):
    """current_facts and upgrade_predicates of Neo4jGraphStore."""

    def current_facts(self, user_id: str, text: str, limit: int, k: int = 20) -> list[dict[str, Any]]:
        """Up to `limit` current facts about what `text` names, and the user's own (rows of CURRENT_FACTS)."""
        if limit <= 0:
            return []
        query = fact_query(user_id, text)
        params = {
            "user_id": user_id,
            "self_uid": entity_uid(user_id, entity_key(SELF)),
            "entity_query": query,
            "k": k,
            "limit": limit,
        }
        statement = CURRENT_FACTS if query is not None else CURRENT_FACTS_OF_USER
        with translated("current_facts"), self._read_session() as session:
            return [native(dict(r)) for r in session.run(statement, params)]

    def upgrade_predicates(self) -> None:
        """Give relationships stored before predicates the default one (once per database)."""
        with translated("upgrade_predicates"), self._session() as session:
            if session.run(PREDICATES_DONE).single(strict=True)["done"]:
                return
            session.run(SET_PREDICATES).consume()
            session.run(MARK_PREDICATES).consume()
