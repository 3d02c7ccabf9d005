"""export_user: a user's memory as JSON Lines (api_stub/export_format.py), read from Neo4j in pages
(worker/graph/portable.py): memory bounded by a page (50 episodes; 1,000 entities, relationships or
sessions), whatever the user's history."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from api_stub.export_format import (
    VERSION,
    Counts,
    EndLine,
    EntityLine,
    EpisodeLine,
    HeaderLine,
    RelationshipLine,
    SessionLine,
)
from worker.facts_text import DEFAULT_PREDICATE
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.graph.values import native
from worker.llm.embeddings import pack
from worker.models import Entity, FactEnd, Relationship


def export_lines(store: Neo4jGraphStore, user_id: str, embedding_model: str | None = None) -> Iterator[str]:
    """The user's memory as JSON Lines (each ends with a newline); nothing is read until iterated.
    embedding_model: the model this deployment's window embeddings were made with."""
    counts = Counts(**store.export_counts(user_id))
    header = HeaderLine(
        version=VERSION,
        user_id=user_id,
        exported_at=datetime.now(UTC),
        counts=counts,
        embedding_model=embedding_model,
    )
    yield _dump(header)
    written: Counter[str] = Counter()
    for row in store.export_episodes(user_id):
        written["episodes"] += 1
        yield _dump(_episode_line(row))
    for row in store.export_entities(user_id):
        written["entities"] += 1
        yield _dump(EntityLine(**{k: row[k] for k in EntityLine.model_fields if k != "kind"}))
    for row in store.export_relationships(user_id):
        written["relationships"] += 1
        fields = {k: row[k] for k in RelationshipLine.model_fields if k != "kind"}
        yield _dump(RelationshipLine(**{**fields, "weight": float(fields["weight"])}))
    for row in store.export_sessions(user_id):
        written["sessions"] += 1
        yield _dump(SessionLine(**{k: row[k] for k in SessionLine.model_fields if k != "kind"}))
    yield _dump(EndLine(lines=Counts(**{k: written[k] for k in Counts.model_fields})))


def _dump(line: BaseModel) -> str:
    return line.model_dump_json() + "\n"


def _episode_line(row: dict[str, Any]) -> EpisodeLine:
    episode = row["episode"]
    names = {uid: name for uid, name, _type, _description in row["mentions"]}
    entities = [Entity(name=name, type=type_ or "other", description=d or "") for _, name, type_, d in row["mentions"]]
    added: Iterable[tuple[Any, ...]]
    if episode.get("rel_sources") is not None:
        sources = episode["rel_sources"]
        added = zip(
            sources,
            episode["rel_targets"],
            episode.get("rel_predicates") or [DEFAULT_PREDICATE] * len(sources),  # saved before predicates
            episode["rel_weights"],
            episode["rel_descriptions"],
            strict=True,
        )
    else:  # saved before episodes recorded what they added: an equal share of what lists them
        added = (tuple(r) for r in row["legacy_relationships"] or [])
    relationships = [
        Relationship(source=names[s], target=names[t], predicate=p, weight=float(w), description=d or "")
        for s, t, p, w, d in added
        if s in names and t in names
    ]
    ended = [FactEnd(source_key=a, predicate=p, target_key=b, at=native(at)) for a, p, b, at in row["ended"]]
    windows = [(int(start), int(end)) for start, end, _ in row["windows"]]
    vectors = [vector for _, _, vector in row["windows"]]
    packed = [pack(v) for v in vectors] if len(vectors) == len(windows) and all(vectors) else []
    fields = {k: episode.get(k) for k in EpisodeLine.model_fields if k in episode and k != "kind"}
    return EpisodeLine(
        **fields,
        entities=entities,
        relationships=relationships,
        search_windows=windows,
        window_vectors=packed,
        ended_facts=ended,
    )
