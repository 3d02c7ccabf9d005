"""Small builders for test data."""

from __future__ import annotations

import uuid

from worker.models import Entity, EpisodeRecord, Relationship


def record(
    user_id: str, content: str, *, summary: str = "", session_id: str = "s1", episode_id: str = ""
) -> EpisodeRecord:
    return EpisodeRecord(
        id=episode_id or f"ep_{uuid.uuid4().hex}",
        user_id=user_id,
        session_id=session_id,
        summary=summary or content[:80],
        content=content,
        extraction="offline",
        model="offline",
        message_count=1,
    )


def entities(*names: str, type_: str = "person") -> list[Entity]:
    return [Entity(name=n, type=type_, description=f"about {n}") for n in names]


def relation(source: str, target: str, weight: float = 1.0, description: str = "knows") -> Relationship:
    return Relationship(source=source, target=target, weight=weight, description=description)
