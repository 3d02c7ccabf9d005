"""The persist transaction: check (write_checks.py), claim, then write what was claimed."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from neo4j import ManagedTransaction

from worker.errors import StoreRequestError
from worker.facts_text import DEFAULT_PREDICATE
from worker.graph import cypher
from worker.graph.facts import END_FACTS
from worker.graph.params import EpisodeWrite, build_save_params
from worker.graph.write_checks import check_writes
from worker.models import SaveResult, SessionProgress


def save_transaction(
    tx: ManagedTransaction,
    first: Mapping[str, EpisodeWrite],
    lines: Mapping[str, SessionProgress],
    token: str,
    now: datetime,
) -> dict[str, SaveResult]:
    """One result per episode id of `first` (episode id → its write); see Neo4jGraphStore.save_episodes."""
    owners = {episode_id: write[0].user_id for episode_id, write in first.items()}
    refused = check_writes(tx, list(first.values()), lines)
    results = {i: SaveResult(episode_id=i, created=False, outcome=why) for i, why in refused.items()}
    todo = [write for i, write in first.items() if i not in refused]
    if not todo:
        return results
    params = build_save_params(todo)
    claims = list(tx.run(cypher.CLAIM_EPISODES, episodes=params.episodes, token=token))
    foreign = [c["id"] for c in claims if c["user_id"] != owners[c["id"]]]
    if foreign:
        raise StoreRequestError(f"episode {foreign[0]} already belongs to another user")
    created = {c["id"] for c in claims if c["created"]}
    sources = {w[0].id: w[0].source_digest for w in todo}
    for c in claims:
        if c["id"] in created:
            continue
        # A send of this version with an id stored by an earlier one (no digest) is a reused id too: the
        # same send would have been found unchanged before. A payload without a digest: a redelivery.
        stored, sent = c["source_digest"], sources[c["id"]]
        conflict = bool(sent) and stored != sent
        results[c["id"]] = SaveResult(episode_id=c["id"], created=False, outcome="conflict" if conflict else "exists")
    if not created:
        return results
    # Only a send written now moves its session's line (a redelivered one was counted when written).
    progress_rows = [lines[i].model_dump(exclude={"start", "erased_at"}) for i in sorted(lines) if i in created]
    if progress_rows:
        tx.run(cypher.SAVE_PROGRESS, rows=progress_rows, now=now).consume()
    entity_rows = [row for row in params.entities if row["episode_id"] in created]
    relationship_rows = [row for row in params.relationships if row["episode_id"] in created]
    n_entities = counted(tx, cypher.SAVE_ENTITIES, entity_rows, now)
    n_relationships = counted(tx, cypher.SAVE_RELATIONSHIPS, relationship_rows, now)
    end_rows = [row for row in params.ends if row["episode_id"] in created]
    if end_rows:  # after the episodes' own facts: an imported batch may hold a fact and what ended it
        tx.run(END_FACTS, rows=end_rows, default_predicate=DEFAULT_PREDICATE).consume()
    save_chunks(tx, [row for row in params.chunks if row["episode_id"] in created])
    tx.run(cypher.RELEASE_CLAIMS, ids=sorted(created)).consume()
    for episode_id in created:
        results[episode_id] = SaveResult(
            episode_id=episode_id,
            created=True,
            entities=n_entities.get(episode_id, 0),
            relationships=n_relationships.get(episode_id, 0),
            outcome="created",
        )
    return results


def save_chunks(tx: ManagedTransaction, rows: list[dict[str, Any]]) -> None:
    """Search windows, then the embeddings of those that have one."""
    if not rows:
        return
    tx.run(cypher.SAVE_CHUNKS, rows=rows).consume()
    vectors = [r for r in rows if r.get("embedding")]
    if vectors:
        tx.run(cypher.SET_CHUNK_VECTORS, rows=vectors).consume()


def counted(tx: ManagedTransaction, statement: str, rows: list[dict[str, Any]], now: datetime) -> dict[str, int]:
    """Episode id → rows the statement wrote for it (SAVE_ENTITIES, SAVE_RELATIONSHIPS)."""
    if not rows:
        return {}
    return {r["id"]: r["n"] for r in tx.run(statement, rows=rows, now=now)}
