"""Every Cypher statement of the project. User data only ever arrives as $parameters."""

from __future__ import annotations

EPISODE_FULLTEXT = "episode_text"
ENTITY_FULLTEXT = "entity_text"

# cjk indexes CJK text as bigrams and Latin text as lower-cased words (English stop words removed).
_FULLTEXT_OPTIONS = "OPTIONS {indexConfig: {`fulltext.analyzer`: 'cjk', `fulltext.eventually_consistent`: false}}"

SCHEMA: tuple[str, ...] = (
    "CREATE CONSTRAINT episode_id IF NOT EXISTS FOR (e:Episode) REQUIRE e.id IS UNIQUE",
    "CREATE CONSTRAINT entity_uid IF NOT EXISTS FOR (n:Entity) REQUIRE n.uid IS UNIQUE",
    "CREATE CONSTRAINT session_progress_key IF NOT EXISTS FOR (p:SessionProgress) REQUIRE p.key IS UNIQUE",
    "CREATE INDEX session_progress_user IF NOT EXISTS FOR (p:SessionProgress) ON (p.user_id)",
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
# transaction sees its own token and goes on to write that episode's entities; for the others it is a no-op.
CLAIM_EPISODES = """
UNWIND $episodes AS ep
MERGE (e:Episode {id: ep.id})
ON CREATE SET e += ep, e.save_token = $token
RETURN ep.id AS id, e.save_token = $token AS created, e.user_id AS user_id
"""

SAVE_ENTITIES = """
UNWIND $rows AS row
MATCH (e:Episode {id: row.episode_id})
MERGE (n:Entity {uid: row.uid})
ON CREATE SET n.user_id = row.user_id, n.user_tag = row.user_tag, n.key = row.key, n.name = row.name,
              n.type = row.type, n.description = '', n.first_seen = $now, n.last_seen = $now, n.mentions = 0
SET n.mentions = n.mentions + 1,
    n.last_seen = CASE WHEN $now > n.last_seen THEN $now ELSE n.last_seen END,
    n.type = CASE WHEN n.type = 'other' THEN row.type ELSE n.type END,
    n.description = CASE WHEN row.description <> '' THEN row.description ELSE n.description END
MERGE (e)-[:MENTIONS]->(n)
RETURN row.episode_id AS id, count(n) AS n
"""

SAVE_RELATIONSHIPS = """
UNWIND $rows AS row
MATCH (a:Entity {uid: row.source_uid})
MATCH (b:Entity {uid: row.target_uid})
MERGE (a)-[r:RELATED_TO]->(b)
ON CREATE SET r.user_id = row.user_id, r.weight = 0.0, r.episodes = [], r.description = ''
SET r.weight = r.weight + row.weight,
    r.description = CASE WHEN row.description <> '' THEN row.description ELSE r.description END,
    r.episodes = (r.episodes + row.episode_id)[-50..],
    r.updated_at = $now
RETURN row.episode_id AS id, count(r) AS n
"""

# How far a session's messages are extracted; it only moves forward, and is written in the same
# transaction as the episode that advanced it.
SAVE_PROGRESS = """
UNWIND $rows AS row
MERGE (p:SessionProgress {key: row.key})
ON CREATE SET p.user_id = row.user_id, p.session_id = row.session_id, p.extracted = -1
WITH p, row, row.extracted > p.extracted AS ahead
SET p.digest = CASE WHEN ahead THEN row.digest ELSE p.digest END,
    p.extracted = CASE WHEN ahead THEN row.extracted ELSE p.extracted END,
    p.updated_at = $now
"""

GET_PROGRESS = """
MATCH (p:SessionProgress {key: $key})
WHERE p.user_id = $user_id
RETURN p.extracted AS extracted, p.digest AS digest
"""

RELEASE_CLAIMS = "UNWIND $ids AS id MATCH (e:Episode {id: id}) REMOVE e.save_token"

# --- recall path -------------------------------------------------------------------------------------

# Recall in one round trip: two candidate lists (episode text by BM25; episodes mentioning entities whose
# name/description match), fused by reciprocal rank fusion (score = sum of 1 / ($rrf_k + rank)), ties broken
# by recency, then the winners' entities and the relations among them. The Lucene query already carries
# +user_tag:<tag>; the exact user_id checks here are what guarantee isolation.
SEARCH = f"""
CALL () {{
  CALL db.index.fulltext.queryNodes('{EPISODE_FULLTEXT}', $lucene, {{limit: $k}}) YIELD node, score
  WHERE node.user_id = $user_id
  RETURN collect(node) AS by_text
}}
CALL () {{
  CALL db.index.fulltext.queryNodes('{ENTITY_FULLTEXT}', $lucene, {{limit: $k}}) YIELD node, score
  WHERE node.user_id = $user_id
  MATCH (ep)-[:MENTIONS]->(node)  // MENTIONS only leaves episodes: no label check per row
  WHERE ep.user_id = $user_id
  WITH ep, sum(score) AS s, collect(node.name)[..5] AS names
  ORDER BY s DESC, ep.created_at DESC
  LIMIT $k
  RETURN collect(ep) AS by_entity, collect(names) AS entity_names
}}
WITH by_text, by_entity, entity_names, size(by_text) AS nt
UNWIND range(0, nt + size(by_entity) - 1) AS i
WITH CASE WHEN i < nt THEN by_text[i] ELSE by_entity[i - nt] END AS ep,
     1.0 / ($rrf_k + 1 + CASE WHEN i < nt THEN i ELSE i - nt END) AS part,
     CASE WHEN i < nt THEN true END AS via_text,
     CASE WHEN i < nt THEN [] ELSE entity_names[i - nt] END AS names
WITH ep, sum(part) AS score, count(via_text) > 0 AS via_text, collect(names) AS name_lists
ORDER BY score DESC, ep.created_at DESC
LIMIT $limit
WITH collect(ep {{.id, .user_id, .session_id, .summary, .created_at, .occurred_at, .extraction,
                 score: score, via_text: via_text,
                 via_entities: reduce(acc = [], l IN name_lists | acc + l)}}) AS episodes,
     collect(ep) AS eps
CALL (eps) {{
  UNWIND range(0, size(eps) - 1) AS rank
  WITH eps[rank] AS ep, rank
  MATCH (ep)-[:MENTIONS]->(n)
  RETURN collect(DISTINCT n) AS mentioned, collect(DISTINCT CASE WHEN rank = 0 THEN n END) AS first
}}
// one hop out of what the query is about: the entities it matched, then the best episode's entities
WITH episodes, mentioned, first,
     reduce(acc = [], e IN episodes | acc + e.via_entities) AS matched_names
WITH episodes, mentioned,
     ([n IN mentioned WHERE n.name IN matched_names] + [n IN first WHERE NOT n.name IN matched_names])[..$max_seeds]
     AS seeds
CALL (mentioned, seeds) {{
  UNWIND seeds AS a
  MATCH (a)-[r:RELATED_TO]-(b)  // RELATED_TO only joins entities of one user (checked again in Python)
  WHERE r.user_id = $user_id
  WITH r, b, b IN mentioned AS inner
  ORDER BY r.weight DESC
  WITH collect(DISTINCT CASE WHEN NOT inner THEN b END)[..$max_neighbours] AS neighbours,
       collect({{r: r, b: b, inner: inner}}) AS edges
  RETURN neighbours, [e IN edges WHERE e.inner OR e.b IN neighbours | e.r] AS kept
}}
WITH episodes, mentioned, neighbours, kept
CALL (kept) {{
  UNWIND kept AS r
  WITH DISTINCT r
  ORDER BY r.weight DESC
  LIMIT $max_relations
  RETURN collect({{user_id: r.user_id, source: startNode(r).name, target: endNode(r).name,
                  description: r.description, weight: r.weight}}) AS relations
}}
RETURN episodes,
       [n IN mentioned | n {{.uid, .user_id, .name, .type, .description, .mentions, hop: 0}}]
       + [n IN neighbours | n {{.uid, .user_id, .name, .type, .description, .mentions, hop: 1}}] AS entities,
       relations
"""

REMEMBERED = """
CALL () {
  MATCH (n:Entity {user_id: $user_id})
  WITH n ORDER BY n.mentions DESC, n.name LIMIT $limit
  RETURN collect(n {.uid, .user_id, .name, .type, .description, .mentions, hop: 0}) AS entities
}
CALL () {
  MATCH (a:Entity {user_id: $user_id})-[r:RELATED_TO]->(b:Entity)
  WITH a, r, b ORDER BY r.weight DESC, a.name LIMIT $limit
  RETURN collect({user_id: r.user_id, source: a.name, target: b.name, description: r.description,
                  weight: r.weight}) AS relations
}
RETURN [] AS episodes, entities, relations
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

DELETE_USER_PROGRESS_BATCH = """
MATCH (n:SessionProgress {user_id: $user_id})
WITH n LIMIT $batch
DETACH DELETE n
RETURN count(*) AS n
"""

# Episodes first (their MENTIONS go with them), then entities (with their RELATED_TO), then progress.
DELETE_USER_BATCHES = (DELETE_USER_EPISODES_BATCH, DELETE_USER_ENTITIES_BATCH, DELETE_USER_PROGRESS_BATCH)

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
