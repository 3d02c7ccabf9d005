"""Turn an episode's extraction into the parameter maps of the save transaction (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.identity import entity_uid, normalize_name, user_tag
from worker.models import Entity, EpisodeRecord, Relationship


@dataclass(frozen=True)
class SaveParams:
    episode: dict[str, Any]
    entities: list[dict[str, Any]]
    relationships: list[dict[str, Any]]


def _key(name: str) -> str:
    return normalize_name(name) or name.strip()


def build_save_params(
    record: EpisodeRecord, entities: Sequence[Entity], relationships: Sequence[Relationship]
) -> SaveParams:
    """Entities are merged on their normalised key; a relationship end that is not among the entities
    becomes an entity of type 'other' (nothing is dropped); repeated relationships add their weights."""
    user_id = record.user_id
    by_key: dict[str, dict[str, Any]] = {}

    def add(name: str, type_: str, description: str) -> str:
        key = _key(name)
        known = by_key.get(key)
        if known is None:
            by_key[key] = {
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

    rels: dict[tuple[str, str], dict[str, Any]] = {}
    for rel in relationships:
        source, target = add(rel.source, "", ""), add(rel.target, "", "")
        merged = rels.get((source, target))
        if merged is None:
            rels[(source, target)] = {
                "source_uid": by_key[source]["uid"],
                "target_uid": by_key[target]["uid"],
                "description": rel.description,
                "weight": float(rel.weight),
            }
        else:
            merged["weight"] += float(rel.weight)
            if rel.description:
                merged["description"] = rel.description

    episode = record.model_dump()
    episode["user_tag"] = user_tag(user_id)
    # Sorted so that concurrent transactions lock shared entities in the same order (fewer deadlocks).
    ordered = sorted(by_key.values(), key=lambda e: e["uid"])
    ordered_rels = sorted(rels.values(), key=lambda r: (r["source_uid"], r["target_uid"]))
    return SaveParams(episode=episode, entities=ordered, relationships=ordered_rels)
