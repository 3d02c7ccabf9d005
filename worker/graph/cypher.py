"""Every Cypher statement of the project. User data only ever arrives as $parameters."""

from __future__ import annotations

EPISODE_FULLTEXT = "episode_text"
ENTITY_FULLTEXT = "entity_text"

# cjk indexes CJK text as bigrams and Latin text as lower-cased words (English stop words removed).
_FULLTEXT_OPTIONS = "OPTIONS {indexConfig: {`fulltext.analyzer`: 'cjk', `fulltext.eventually_consistent`: false}}"

SCHEMA: tuple[str, ...] = (
    "CREATE CONSTRAINT episode_id IF NOT EXISTS FOR (e:Episode) REQUIRE e.id IS UNIQUE",
    "CREATE CONSTRAINT entity_uid IF NOT EXISTS FOR (n:Entity) REQUIRE n.uid IS UNIQUE",
    "CREATE INDEX episode_user IF NOT EXISTS FOR (e:Episode) ON (e.user_id)",
    "CREATE INDEX episode_user_created IF NOT EXISTS FOR (e:Episode) ON (e.user_id, e.created_at)",
    "CREATE INDEX entity_user IF NOT EXISTS FOR (n:Entity) ON (n.user_id)",
    f"CREATE FULLTEXT INDEX {EPISODE_FULLTEXT} IF NOT EXISTS FOR (e:Episode) "
    f"ON EACH [e.summary, e.content, e.user_tag] {_FULLTEXT_OPTIONS}",
    f"CREATE FULLTEXT INDEX {ENTITY_FULLTEXT} IF NOT EXISTS FOR (n:Entity) "
    f"ON EACH [n.name, n.description, n.user_tag] {_FULLTEXT_OPTIONS}",
)

AWAIT_INDEXES = "CALL db.awaitIndexes($timeout_s)"

PING = "RETURN 1 AS ok"

# --- write path --------------------------------------------------------------------------------------

# MERGE under the uniqueness constraint serialises concurrent saves of one episode: exactly one
# transaction sees its own token and goes on to write entities; every other one is a no-op.
CLAIM_EPISODE = """
MERGE (e:Episode {id: $episode.id})
ON CREATE SET e += $episode, e.save_token = $token
RETURN e.save_token = $token AS created, e.user_id AS user_id
"""

SAVE_ENTITIES = """
MATCH (e:Episode {id: $episode_id})
UNWIND $entities AS ent
MERGE (n:Entity {uid: ent.uid})
ON CREATE SET n.user_id = $user_id, n.user_tag = $user_tag, n.key = ent.key, n.name = ent.name,
              n.type = ent.type, n.description = '', n.first_seen = $now, n.last_seen = $now, n.mentions = 0
SET n.mentions = n.mentions + 1,
    n.last_seen = CASE WHEN $now > n.last_seen THEN $now ELSE n.last_seen END,
    n.type = CASE WHEN n.type = 'other' THEN ent.type ELSE n.type END,
    n.description = CASE WHEN ent.description <> '' THEN ent.description ELSE n.description END
MERGE (e)-[:MENTIONS]->(n)
RETURN count(n) AS entities
"""

SAVE_RELATIONSHIPS = """
UNWIND $relationships AS rel
MATCH (a:Entity {uid: rel.source_uid})
MATCH (b:Entity {uid: rel.target_uid})
MERGE (a)-[r:RELATED_TO]->(b)
ON CREATE SET r.user_id = $user_id, r.weight = 0.0, r.episodes = [], r.description = ''
SET r.weight = r.weight + rel.weight,
    r.description = CASE WHEN rel.description <> '' THEN rel.description ELSE r.description END,
    r.episodes = (r.episodes + $episode_id)[-50..],
    r.updated_at = $now
RETURN count(r) AS relationships
"""

RELEASE_CLAIM = "MATCH (e:Episode {id: $episode_id}) REMOVE e.save_token"

# --- recall path -------------------------------------------------------------------------------------

# Both candidate lists in one round trip. The Lucene query already carries +user_tag:<tag>; the exact
# user_id check here is what guarantees isolation.
SEARCH_CANDIDATES = f"""
CALL () {{
  CALL db.index.fulltext.queryNodes('{EPISODE_FULLTEXT}', $lucene, {{limit: $k}}) YIELD node, score
  WHERE node.user_id = $user_id
  RETURN collect([node.id, score, node.created_at]) AS by_text
}}
CALL () {{
  CALL db.index.fulltext.queryNodes('{ENTITY_FULLTEXT}', $lucene, {{limit: $k}}) YIELD node, score
  WHERE node.user_id = $user_id
  MATCH (ep:Episode)-[:MENTIONS]->(node)
  WHERE ep.user_id = $user_id
  WITH ep, sum(score) AS s, collect(node.name)[..5] AS names
  ORDER BY s DESC, ep.created_at DESC
  LIMIT $k
  RETURN collect([ep.id, s, ep.created_at, names]) AS by_entity
}}
RETURN by_text, by_entity
"""

HYDRATE = """
UNWIND $ids AS id
MATCH (ep:Episode {id: id})
WHERE ep.user_id = $user_id
OPTIONAL MATCH (ep)-[:MENTIONS]->(n:Entity)
WITH collect(DISTINCT ep {.id, .user_id, .session_id, .summary, .created_at, .occurred_at, .extraction})
       AS episodes,
     collect(DISTINCT n) AS ents
CALL (ents) {
  UNWIND ents AS a
  MATCH (a)-[r:RELATED_TO]->(b:Entity)
  WHERE b IN ents AND r.user_id = $user_id
  WITH r, a, b ORDER BY r.weight DESC LIMIT $max_relations
  RETURN collect({user_id: r.user_id, source: a.name, target: b.name, description: r.description,
                  weight: r.weight}) AS relations
}
RETURN episodes,
       [n IN ents | n {.uid, .user_id, .name, .type, .description, .mentions}] AS entities,
       relations
"""

# --- erase and counts --------------------------------------------------------------------------------

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

DELETE_USER_ENTITIES_BATCH = """
MATCH (n:Entity {user_id: $user_id})
WITH n LIMIT $batch
DETACH DELETE n
RETURN count(*) AS n
"""

# Episodes first (their MENTIONS go with them), then entities (with their RELATED_TO).
DELETE_USER_BATCHES = (DELETE_USER_EPISODES_BATCH, DELETE_USER_ENTITIES_BATCH)

STATS_ALL = """
CALL () { MATCH (e:Episode) RETURN count(e) AS episodes }
CALL () { MATCH (n:Entity) RETURN count(n) AS entities }
CALL () { MATCH ()-[r:RELATED_TO]->() RETURN count(r) AS relationships }
CALL () { MATCH (e:Episode) RETURN count(DISTINCT e.user_id) AS users }
RETURN episodes, entities, relationships, users
"""

STATS_USER = """
CALL () { MATCH (e:Episode {user_id: $user_id}) RETURN count(e) AS episodes }
CALL () { MATCH (n:Entity {user_id: $user_id}) RETURN count(n) AS entities }
CALL () { MATCH (:Entity {user_id: $user_id})-[r:RELATED_TO]->() RETURN count(r) AS relationships }
RETURN episodes, entities, relationships, CASE WHEN episodes + entities > 0 THEN 1 ELSE 0 END AS users
"""

# The bare fulltext query, used by benchmarks as the floor that search latency is compared with.
BARE_EPISODE_FULLTEXT = f"""
CALL db.index.fulltext.queryNodes('{EPISODE_FULLTEXT}', $lucene, {{limit: $k}}) YIELD node, score
RETURN node.id AS id, score
"""
