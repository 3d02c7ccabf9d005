"""Turn an episode's extraction into the parameter maps of the save transaction (pure, no I/O)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from worker.facts_text import fact_time
from worker.identity import entity_key, entity_uid, user_tag
from worker.llm.embeddings import unpack
from worker.models import Entity, EpisodeRecord, Relationship
from worker.terms import indexed

WINDOW_NEIGHBOURS = 1  # a search window is a message with this many neighbours on each side (measured: LoCoMo)


@dataclass(frozen=True)
class SaveParams:
    """Rows for the UNWIND statements of one save transaction; each row names its episode and user."""

    episodes: list[dict[str, Any]]
    entities: list[dict[str, Any]]
    relationships: list[dict[str, Any]]
    chunks: list[dict[str, Any]]
    ends: list[dict[str, Any]]  # known facts the episodes ended (worker/graph/facts.py END_FACTS)


EpisodeWrite = tuple[EpisodeRecord, Sequence[Entity], Sequence[Relationship]]


def build_save_params(writes: Sequence[EpisodeWrite]) -> SaveParams:
    """All rows of a batch, sorted so that concurrent transactions lock shared nodes in the same order."""
    episodes, entities, relationships, chunks, ends = [], [], [], [], []
    for record, ents, rels in writes:
        ended = end_rows(record)
        episode, entity_rows, relationship_rows = _episode_rows(record, ents, rels, ended)
        episodes.append(episode)
        entities.extend(entity_rows)
        relationships.extend(relationship_rows)
        chunks.extend(chunk_rows(record))
        ends.extend(ended)
    return SaveParams(
        episodes=sorted(episodes, key=lambda e: e["id"]),
        entities=sorted(entities, key=lambda e: (e["uid"], e["episode_id"])),
        # a fact's rows in time order (a later one may make it current again, or end it: worker/graph/facts.py)
        relationships=sorted(
            relationships,
            key=lambda r: (r["source_uid"], r["target_uid"], r["predicate"], r["valid_from"], r["episode_id"]),
        ),
        chunks=chunks,
        ends=sorted(ends, key=lambda r: (r["source_uid"], r["target_uid"], r["predicate"], r["at"], r["episode_id"])),
    )


def episode_time(record: EpisodeRecord) -> datetime:
    """When an episode happened: its occurred_at, else when add_episode accepted it (a backlog or a replay
    extracts it later; the caller's clock, never after it was stored), else when it was stored."""
    if record.occurred_at is not None:
        return record.occurred_at
    if record.accepted_at is not None:
        return min(datetime.fromtimestamp(record.accepted_at, UTC), record.created_at)
    return record.created_at


def end_rows(record: EpisodeRecord) -> list[dict[str, Any]]:
    """The known facts the episode's extraction ended, as END_FACTS rows (ended at the replacing fact's
    valid_from, else at the episode's time)."""
    rows = []
    for end in record.ended_facts:
        by = end.replaced_by if len(end.replaced_by) == 3 else None
        rows.append(
            {
                "episode_id": record.id,
                "user_id": record.user_id,
                "source_uid": entity_uid(record.user_id, end.source_key),
                "predicate": end.predicate,
                "target_uid": entity_uid(record.user_id, end.target_key),
                "at": end.at or episode_time(record),
                "key": fact_key(end.source_key, end.predicate, end.target_key),
                "by_source_uid": entity_uid(record.user_id, by[0]) if by else None,
                "by_predicate": by[1] if by else None,
                "by_target_uid": entity_uid(record.user_id, by[2]) if by else None,
            }
        )
    return rows


def fact_key(source_key: str, predicate: str, target_key: str) -> str:
    """How a fact names another in `replaces`: by entity keys, so it reads the same for any user id."""
    return json.dumps([source_key, predicate, target_key], ensure_ascii=False)


def window_texts(content: str, spans: Sequence[tuple[int, int]]) -> list[str]:
    """The text of each search window, in order (what the embedding model is given)."""
    return [content[start:end] for start, end in windows(spans, len(content))]


def windows(spans: Sequence[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """One search window per message: [start, end) of the message and its neighbours. Without spans the
    whole text is one window."""
    if not spans:
        return [(0, length)] if length else []
    last = len(spans) - 1
    return [
        (spans[max(0, i - WINDOW_NEIGHBOURS)][0], spans[min(last, i + WINDOW_NEIGHBOURS)][1]) for i in range(len(spans))
    ]


def spans_from_windows(exported: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Message spans whose windows are exactly these (an import restores an episode's windows as exported).
    A window is (start of the previous message, end of the next), so message i starts where window i + 1
    does and ends where window i - 1 does; the first message's end and the last one's start are never read."""
    assert WINDOW_NEIGHBOURS == 1, "spans_from_windows reads windows of one neighbour a side"
    n = len(exported)
    if n <= 1:
        return tuple(exported)
    starts = [exported[i + 1][0] for i in range(n - 1)] + [exported[n - 1][0]]
    ends = [exported[0][1]] + [exported[i - 1][1] for i in range(1, n)]
    return tuple(zip(starts, ends, strict=True))


_ROLE_LINE = re.compile(r"^(?:user|assistant|system|tool): ", re.M)


def spans_from_content(content: str) -> tuple[tuple[int, int], ...]:
    """Message spans recovered from stored `role: text` lines (for episodes stored before spans existed)."""
    starts = [m.start() for m in _ROLE_LINE.finditer(content)] or [0]
    ends = [s - 1 for s in starts[1:]] + [len(content)]
    return tuple(zip(starts, ends, strict=True))


def reindex_rows(episode: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """(episode terms, chunk rows) for a stored episode that has neither (stored before they existed)."""
    content = episode.get("content") or ""
    record = EpisodeRecord(
        id=episode["id"],
        user_id=episode["user_id"],
        session_id="-",
        summary=episode.get("summary") or "",
        content=content or None,
        extraction="offline",
        model="-",
        message_spans=spans_from_content(content) if content else (),
    )
    return indexed(f"{record.summary}\n{content}"), chunk_rows(record)


def chunk_rows(record: EpisodeRecord) -> list[dict[str, Any]]:
    """The episode's search windows as Chunk rows: offsets into the episode's content and their terms.
    No content stored (MEMORY_STORE_CONTENT=false), no windows: nothing derived from the text is kept."""
    if not record.content:
        return []
    tag = user_tag(record.user_id)
    rows = []
    for seq, (start, end) in enumerate(windows(record.message_spans, len(record.content))):
        rows.append(
            {
                "episode_id": record.id,
                "user_id": record.user_id,
                "user_tag": tag,
                "seq": seq,
                "start": start,
                "end": end,
                "terms": indexed(record.content[start:end]),
                "embedding": unpack(record.window_vectors[seq]) if seq < len(record.window_vectors) else None,
            }
        )
    return rows


def _episode_rows(
    record: EpisodeRecord,
    entities: Sequence[Entity],
    relationships: Sequence[Relationship],
    ends: Sequence[dict[str, Any]],
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Entities are merged on their normalised key; a relationship end that is not among the entities
    becomes an entity of type 'other' (nothing is dropped); repeated relationships add their weights."""
    user_id = record.user_id
    tag = user_tag(user_id)
    by_key: dict[str, dict[str, Any]] = {}

    def add(name: str, type_: str, description: str) -> str:
        key = entity_key(name)
        known = by_key.get(key)
        if known is None:
            by_key[key] = {
                "episode_id": record.id,
                "user_id": user_id,
                "user_tag": tag,
                "uid": entity_uid(user_id, key),
                "key": key,
                "name": name.strip(),
                "type": type_ or "other",
                "description": description,
            }
        else:
            if known["type"] == "other" and type_:
                known["type"] = type_
            if description:
                known["description"] = description
        return key

    for entity in entities:
        add(entity.name, entity.type, entity.description)

    rels: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rel in relationships:
        source, target = add(rel.source, "", ""), add(rel.target, "", "")
        merged = rels.get((source, rel.predicate, target))
        if merged is None:
            rels[(source, rel.predicate, target)] = {
                "episode_id": record.id,
                "user_id": user_id,
                "source_uid": by_key[source]["uid"],
                "target_uid": by_key[target]["uid"],
                "predicate": rel.predicate,
                "description": rel.description,
                "weight": float(rel.weight),
                "valid_from": fact_time(rel.valid_from) or episode_time(record),
                "dated": bool(rel.valid_from),
            }
        else:
            merged["weight"] += float(rel.weight)
            if rel.description:
                merged["description"] = rel.description
            dated = fact_time(rel.valid_from)
            if dated is not None:  # the earliest date the conversation gives wins over the episode's time
                merged["valid_from"] = min(merged["valid_from"], dated) if merged["dated"] else dated
                merged["dated"] = True

    episode = record.model_dump(exclude={"message_spans", "window_vectors", "ended_facts"})
    episode["user_tag"] = tag
    # What this episode adds to each relationship, so that forgetting it takes back exactly that
    # (worker/graph/forget.py).
    episode["rel_sources"] = [r["source_uid"] for r in rels.values()]
    episode["rel_targets"] = [r["target_uid"] for r in rels.values()]
    episode["rel_weights"] = [r["weight"] for r in rels.values()]
    episode["rel_descriptions"] = [r["description"] for r in rels.values()]
    episode["rel_predicates"] = [r["predicate"] for r in rels.values()]
    # The known facts it ended (end_rows), so that forgetting it opens them again (worker/graph/facts.py).
    episode["end_sources"] = [r["source_uid"] for r in ends]
    episode["end_predicates"] = [r["predicate"] for r in ends]
    episode["end_targets"] = [r["target_uid"] for r in ends]
    episode["end_keys"] = [r["key"] for r in ends]
    episode["terms"] = indexed(f"{record.summary}\n{record.content or ''}")  # as reindex_rows does
    return episode, list(by_key.values()), list(rels.values())
