"""Every Cypher statement of the project. User data only ever arrives as $parameters."""

from __future__ import annotations

EPISODE_TERMS = "episode_terms"
CHUNK_TERMS = "chunk_terms"
ENTITY_FULLTEXT = "entity_text"


def _fulltext_options(analyzer: str) -> str:
    return f"OPTIONS {{indexConfig: {{`fulltext.analyzer`: '{analyzer}', `fulltext.eventually_consistent`: false}}}}"


# Episodes and their search windows are indexed on `terms`, which worker/terms.py already analysed (stems,
# CJK bigrams): the whitespace analyzer indexes exactly those. Entity names keep Lucene's cjk analyzer (CJK
# bigrams and lower-cased Latin words).

SCHEMA: tuple[str, ...] = (
    "CREATE CONSTRAINT episode_id IF NOT EXISTS FOR (e:Episode) REQUIRE e.id IS UNIQUE",
    "CREATE CONSTRAINT entity_uid IF NOT EXISTS FOR (n:Entity) REQUIRE n.uid IS UNIQUE",
    "CREATE CONSTRAINT session_progress_key IF NOT EXISTS FOR (p:SessionProgress) REQUIRE p.key IS UNIQUE",
    "CREATE CONSTRAINT user_mark_tag IF NOT EXISTS FOR (u:UserMark) REQUIRE u.user_tag IS UNIQUE",
    "CREATE INDEX session_progress_user IF NOT EXISTS FOR (p:SessionProgress) ON (p.user_id)",
    "CREATE INDEX episode_user IF NOT EXISTS FOR (e:Episode) ON (e.user_id)",
    "CREATE INDEX episode_user_created IF NOT EXISTS FOR (e:Episode) ON (e.user_id, e.created_at)",
    "CREATE INDEX episode_user_occurred IF NOT EXISTS FOR (e:Episode) ON (e.user_id, e.occurred_at)",
    "CREATE INDEX entity_user IF NOT EXISTS FOR (n:Entity) ON (n.user_id)",
    "CREATE INDEX chunk_user IF NOT EXISTS FOR (c:Chunk) ON (c.user_id)",
    "CREATE INDEX episode_user_session IF NOT EXISTS FOR (e:Episode) ON (e.user_id, e.session_id)",
    "CREATE CONSTRAINT forgotten_key IF NOT EXISTS FOR (t:Forgotten) REQUIRE t.key IS UNIQUE",
    "CREATE INDEX forgotten_user IF NOT EXISTS FOR (t:Forgotten) ON (t.user_id)",
    "CREATE CONSTRAINT chunk_window IF NOT EXISTS FOR (c:Chunk) REQUIRE (c.episode_id, c.seq) IS UNIQUE",
    "DROP INDEX episode_text IF EXISTS",  # replaced by episode_terms (see README: upgrading)
    f"CREATE FULLTEXT INDEX {EPISODE_TERMS} IF NOT EXISTS FOR (e:Episode) "
    f"ON EACH [e.terms, e.user_tag] {_fulltext_options('whitespace')}",
    f"CREATE FULLTEXT INDEX {CHUNK_TERMS} IF NOT EXISTS FOR (c:Chunk) "
    f"ON EACH [c.terms, c.user_tag] {_fulltext_options('whitespace')}",
    f"CREATE FULLTEXT INDEX {ENTITY_FULLTEXT} IF NOT EXISTS FOR (n:Entity) "
    f"ON EACH [n.name, n.description, n.user_tag] {_fulltext_options('cjk')}",
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
RETURN ep.id AS id, e.save_token = $token AS created, e.user_id AS user_id, e.source_digest AS source_digest
"""

# One node per user tag (a hash: no user id is kept after an erasure). Setting a property takes its write
# lock and the read that follows sees what is committed, so a persist transaction and an erasure of the
# same user are serialised: work accepted before the erasure can never be written after it.
LOCK_USERS = """
UNWIND $tags AS tag
MERGE (u:UserMark {user_tag: tag})
ON CREATE SET u.erased_at = 0.0
SET u.locked_at = $now
RETURN tag, u.erased_at AS erased_at, coalesce(u.erasing_until, 0.0) AS erasing_until
"""

# The sessions' lines, locked for the rest of the persist transaction (see worker/sessions.py).
LOCK_PROGRESS = """
UNWIND $rows AS row
MERGE (p:SessionProgress {key: row.key})
ON CREATE SET p.user_id = row.user_id, p.session_id = row.session_id, p.extracted = 0, p.digest = ''
SET p.locked_at = $now
RETURN row.key AS key, p.extracted AS extracted, p.digest AS digest, p.hashes AS hashes
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
MERGE (e)-[m:MENTIONS]->(n)
SET m.description = row.description
RETURN row.episode_id AS id, count(n) AS n
"""

# A fact is keyed by its ends and predicate (worker/graph/facts.py). Said again after it ended, by an episode
# that dates it from the end on, it is current again from then; what it was before is kept (before_*,
# reopened_by), so that forgetting that episode puts it back. One row at a time (a subquery each: a row reads
# what the rows before it wrote), in time order within a fact (params.py).
SAVE_RELATIONSHIPS = """
UNWIND $rows AS row
CALL (row) {
  MATCH (a:Entity {uid: row.source_uid})
  MATCH (b:Entity {uid: row.target_uid})
  MERGE (a)-[r:RELATED_TO {predicate: row.predicate}]->(b)
  ON CREATE SET r.user_id = row.user_id, r.weight = 0.0, r.episodes = [], r.description = '',
                r.valid_from = row.valid_from
  WITH r, row, r.invalid_from IS NOT NULL AND row.valid_from >= r.invalid_from AS again,
       r.valid_from AS valid_from, r.invalid_from AS invalid_from, r.ended_by AS ended_by
  // support: how many episodes add to it (the list of their ids keeps only the last 50); a relationship from
  // before the counter starts from that list
  SET r.support = coalesce(r.support, size(r.episodes)) + 1,
      r.weight = r.weight + row.weight,
      r.description = CASE WHEN row.description <> '' THEN row.description ELSE r.description END,
      r.episodes = (r.episodes + row.episode_id)[-50..],
      r.updated_at = $now,
      r.valid_from = CASE WHEN again OR valid_from IS NULL OR row.valid_from < valid_from
                          THEN row.valid_from ELSE valid_from END,
      r.invalid_from = CASE WHEN again THEN null ELSE invalid_from END,
      r.ended_by = CASE WHEN again THEN null ELSE ended_by END,
      r.reopened_by = CASE WHEN again THEN row.episode_id ELSE r.reopened_by END,
      r.before_valid_from = CASE WHEN again THEN valid_from ELSE r.before_valid_from END,
      r.before_invalid_from = CASE WHEN again THEN invalid_from ELSE r.before_invalid_from END,
      r.before_ended_by = CASE WHEN again THEN ended_by ELSE r.before_ended_by END
  RETURN r
}
RETURN row.episode_id AS id, count(r) AS n
"""

# Written with the episode that claimed its id (a redelivery writes no second set); MERGE on the unique
# (episode_id, seq) so that two reindex runs at once cannot either.
SAVE_CHUNKS = """
UNWIND $rows AS row
MATCH (e:Episode {id: row.episode_id})
MERGE (c:Chunk {episode_id: row.episode_id, seq: row.seq})
ON CREATE SET c.user_id = row.user_id, c.user_tag = row.user_tag, c.start = row.start, c.end = row.end,
              c.terms = row.terms
MERGE (c)-[:OF]->(e)
"""

# Embeddings stored as float32 (half the size of a Cypher list of floats).
SET_CHUNK_VECTORS = """
UNWIND $rows AS row
MATCH (c:Chunk {episode_id: row.episode_id, seq: row.seq})
WHERE c.embedding IS NULL
CALL db.create.setNodeVectorProperty(c, 'embedding', row.embedding)
"""

# How far a session's messages are extracted; it only moves forward, and is written in the same
# transaction as the episode that advanced it.
SAVE_PROGRESS = """
UNWIND $rows AS row
MERGE (p:SessionProgress {key: row.key})
ON CREATE SET p.user_id = row.user_id, p.session_id = row.session_id
// a row without hashes comes from a payload of before lines: it never replaces a line or a longer count
WITH p, row, size(row.hashes) = 0 AND (p.hashes IS NOT NULL OR p.extracted >= row.extracted) AS stale
SET p.extracted = CASE WHEN stale THEN p.extracted ELSE row.extracted END,
    p.digest = CASE WHEN stale THEN p.digest ELSE row.digest END,
    p.hashes = CASE WHEN stale THEN p.hashes WHEN size(row.hashes) = 0 THEN null ELSE row.hashes END,
    p.updated_at = $now
"""

# What the extract stage needs before it calls the model: the session's line, when the user was last
# erased, and the digest of an episode already stored under this id; one row per request, many requests in
# one query (worker/graph/state_reads.py).
WRITE_STATES = """
UNWIND $rows AS r
OPTIONAL MATCH (p:SessionProgress {key: r.key}) WHERE p.user_id = r.user_id
OPTIONAL MATCH (u:UserMark {user_tag: r.tag})
OPTIONAL MATCH (e:Episode {id: r.episode_id})
CALL (r) { OPTIONAL MATCH (t:Forgotten) WHERE t.key IN r.tombstones RETURN max(t.at) AS forgotten_at }
RETURN r.i AS i, p.extracted AS extracted, p.digest AS digest, p.hashes AS hashes,
       coalesce(u.erased_at, 0.0) AS erased_at, e.user_id AS episode_user, e.source_digest AS episode_digest,
       coalesce(forgotten_at, 0.0) AS forgotten_at
"""

# When the episodes and sessions of a persist batch were last forgotten (worker/graph/forget.py).
FORGOTTEN_AT = "UNWIND $keys AS key MATCH (t:Forgotten {key: key}) RETURN t.key AS key, t.at AS at"

# Episodes stored before search terms existed: found in batches, given their terms and windows.
EPISODES_WITHOUT_TERMS = """
MATCH (e:Episode) WHERE e.terms IS NULL AND e.id > $after
RETURN e.id AS id, e.user_id AS user_id, e.summary AS summary, e.content AS content
ORDER BY e.id
LIMIT $batch
"""

SET_TERMS = """
UNWIND $rows AS row
MATCH (e:Episode {id: row.id})
WHERE e.terms IS NULL
SET e.terms = row.terms
RETURN row.id AS id
"""

RELEASE_CLAIMS = "UNWIND $ids AS id MATCH (e:Episode {id: id}) REMOVE e.save_token"

# --- recall path -------------------------------------------------------------------------------------

# Recall, round trip 1: the candidate lists, each filtered by user_id (the Lucene queries also carry
# +user_tag:<tag>). Search windows (a message with its neighbours) come with their occurrences of the
# query's terms, which worker/graph/bm25.py scores again with the user's statistics (the user's window count
# comes along);
# whole episodes score by Lucene's BM25; episodes that happened in the period the query names; with
# embeddings, the nearest windows. Fusion is a pure Python function (worker/graph/fusion.py).
_WINDOWS = f"""
CALL () {{
  CALL db.index.fulltext.queryNodes('{CHUNK_TERMS}', $terms, {{limit: $k}}) YIELD node
  WHERE node.user_id = $user_id
  WITH node, split(node.terms, ' ') AS stored
  // what BM25 needs of a window: its occurrences of the query's terms and its length in terms
  RETURN collect([node.episode_id, node.seq, [t IN stored WHERE t IN $query_terms], size(stored)]) AS windows
}}
CALL () {{
  MATCH (c:Chunk {{user_id: $user_id}})
  RETURN count(c) AS windows_total
}}
CALL () {{
  CALL db.index.fulltext.queryNodes('{EPISODE_TERMS}', $terms, {{limit: $k}}) YIELD node, score
  WHERE node.user_id = $user_id
  WITH node ORDER BY score DESC, node.id
  RETURN collect(node.id) AS episodes  // best first, ties by id
}}
"""
_NO_WINDOWS = "WITH [] AS windows, 0 AS windows_total, [] AS episodes\n"

_PERIOD = """
CALL () {
  MATCH (e:Episode)
  WHERE e.user_id = $user_id AND e.occurred_at >= $period_from AND e.occurred_at < $period_to
  WITH e ORDER BY e.occurred_at DESC, e.id LIMIT $k
  RETURN collect(e.id) AS in_period
}
"""
_NO_PERIOD = "WITH windows, windows_total, episodes, [] AS in_period\n"

# Exact cosine over the user's own windows: Neo4j 5.26's vector indexes cannot filter by user before they
# pick their nearest neighbours, so a shared index would return other users' windows and miss this user's.
# The cost grows with the user's own history, not with the store.
_DENSE = """
CALL () {
  MATCH (c:Chunk {user_id: $user_id})
  WHERE c.embedding IS NOT NULL
  WITH c.episode_id AS id, c.seq AS seq, vector.similarity.cosine(c.embedding, $vector) AS score
  ORDER BY score DESC
  LIMIT $k
  WITH id, collect(seq)[0] AS seq, max(score) AS score
  RETURN collect([id, score, seq]) AS dense
}
"""
_NO_DENSE = "WITH windows, windows_total, episodes, in_period, [] AS dense\n"

_CANDIDATES_RETURN = "RETURN windows, windows_total, episodes, in_period, dense\n"


def candidates_query(*, text: bool, period: bool, dense: bool) -> str:
    """The candidate read with only the lists this recall uses (each part is a constant of this module)."""
    return (
        (_WINDOWS if text else _NO_WINDOWS)
        + (_PERIOD if period else _NO_PERIOD)
        + (_DENSE if dense else _NO_DENSE)
        + _CANDIDATES_RETURN
    )


# Round trip 2: the winners in their order, with the passage that matched (their best window), their
# entities, the strongest one-hop neighbours of the best episode's entities (at most $max_seeds seeds), and
# the relations among them.
DETAILS = """
UNWIND range(0, size($hits) - 1) AS rank
WITH rank, $hits[rank] AS hit
MATCH (ep:Episode {id: hit.id})
WHERE ep.user_id = $user_id AND ($as_of IS NULL OR coalesce(ep.occurred_at, ep.created_at) <= $as_of)
WITH rank, hit, ep ORDER BY rank LIMIT $limit  // with $as_of, more hits come than are kept: the first that happened
OPTIONAL MATCH (c:Chunk {episode_id: hit.id, seq: hit.seq})
WITH rank, ep, c, CASE WHEN c.end - c.start > $max_window_chars THEN $max_window_chars ELSE c.end - c.start END AS n
WITH rank, ep, CASE WHEN c IS NULL OR ep.content IS NULL THEN '' ELSE substring(ep.content, c.start, n) END AS passage
ORDER BY rank
WITH collect(ep {.id, .user_id, .session_id, .summary, .created_at, .occurred_at, .extraction,
                 passage: passage}) AS episodes,
     collect(ep) AS eps
CALL (eps) {
  UNWIND range(0, size(eps) - 1) AS rank
  WITH eps[rank] AS ep, rank
  MATCH (ep)-[:MENTIONS]->(n)
  WITH rank, n ORDER BY rank, n.uid  // ties broken by key: the same memory gives the same answer, however stored
  RETURN collect(DISTINCT n) AS mentioned, collect(DISTINCT CASE WHEN rank = 0 THEN n END) AS first
}
// one hop out of what the query is about: the best episode's entities
WITH episodes, mentioned, first[..$max_seeds] AS seeds
CALL (mentioned, seeds) {
  UNWIND seeds AS a
  MATCH (a)-[r:RELATED_TO]-(b)  // RELATED_TO only joins entities of one user (checked again in Python)
  WHERE r.user_id = $user_id
    AND ($as_of IS NULL OR coalesce(r.valid_from <= $as_of, true) OR coalesce(r.before_valid_from <= $as_of, false))
  WITH r, b, b IN mentioned AS inner
  ORDER BY r.weight DESC, b.uid
  WITH collect(DISTINCT CASE WHEN NOT inner THEN b END)[..$max_neighbours] AS neighbours,
       collect({r: r, b: b, inner: inner}) AS edges
  RETURN neighbours, [e IN edges WHERE e.inner OR e.b IN neighbours | e.r] AS kept
}
WITH episodes, mentioned, neighbours, kept
// facts current (as of $as_of, else now) first and marked; with $as_of, facts not yet true then are left out
// (their neighbours too, above), and a fact made current again answers with its earlier period when $as_of
// falls in it; without $as_of, a fact dated in the future is kept, not current
CALL (kept) {
  UNWIND kept AS r
  WITH DISTINCT r, coalesce($as_of, datetime()) AS at
  WITH r, $as_of IS NOT NULL AND NOT coalesce(r.valid_from <= at, true)
          AND coalesce(r.before_valid_from <= at, false) AS earlier, at
  WITH r, earlier, CASE WHEN earlier THEN r.before_valid_from ELSE r.valid_from END AS valid_from,
       CASE WHEN earlier THEN r.before_invalid_from ELSE r.invalid_from END AS invalid_from, at
  WITH r, valid_from, invalid_from, coalesce(valid_from <= at, true) AND coalesce(invalid_from > at, true) AS current
  ORDER BY current DESC, r.weight DESC, startNode(r).uid, endNode(r).uid, r.predicate
  LIMIT $max_relations
  RETURN collect({user_id: r.user_id, source: startNode(r).name, target: endNode(r).name,
                  predicate: coalesce(r.predicate, 'related_to'), description: r.description, weight: r.weight,
                  // times as epoch milliseconds: decoding DateTime values cost recall 1.5 ms (measured)
                  valid_from: valid_from.epochMillis, invalid_from: invalid_from.epochMillis,
                  current: current}) AS relations
}
RETURN episodes,
       [n IN mentioned | n {.uid, .user_id, .name, .type, .description, .mentions, hop: 0}]
       + [n IN neighbours | n {.uid, .user_id, .name, .type, .description, .mentions, hop: 1}] AS entities,
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
  WITH a, r, b, coalesce(r.valid_from <= datetime(), true) AND coalesce(r.invalid_from > datetime(), true) AS current
  ORDER BY current DESC, r.weight DESC, a.name LIMIT $limit
  RETURN collect({user_id: r.user_id, source: a.name, target: b.name, predicate: coalesce(r.predicate, 'related_to'),
                  description: r.description, weight: r.weight, valid_from: r.valid_from.epochMillis,
                  invalid_from: r.invalid_from.epochMillis, current: current}) AS relations
}
RETURN [] AS episodes, entities, relations
"""

# --- erase and counts --------------------------------------------------------------------------------

STATS_ALL = """
CALL () { MATCH (e:Episode) RETURN count(e) AS episodes }
CALL () { MATCH (n:Entity) RETURN count(n) AS entities }
CALL () { MATCH ()-[r:RELATED_TO]->() RETURN count(r) AS relationships }
CALL () { MATCH (e:Episode) RETURN count(DISTINCT e.user_id) AS users }
RETURN episodes, entities, relationships, users
"""

EPISODE_COUNT = "MATCH (e:Episode {user_id: $user_id}) RETURN count(e) AS episodes"

STATS_USER = f"""
CALL () {{ {EPISODE_COUNT} }}
CALL () {{ MATCH (n:Entity {{user_id: $user_id}}) RETURN count(n) AS entities }}
CALL () {{ MATCH (:Entity {{user_id: $user_id}})-[r:RELATED_TO]->() RETURN count(r) AS relationships }}
RETURN episodes, entities, relationships, CASE WHEN episodes + entities > 0 THEN 1 ELSE 0 END AS users
"""

# The bare fulltext query over search windows (recall's main list), the floor benchmarks compare it with.
BARE_FULLTEXT = f"""
CALL db.index.fulltext.queryNodes('{CHUNK_TERMS}', $lucene, {{limit: $k}}) YIELD node, score
RETURN node.episode_id AS id, score
"""
