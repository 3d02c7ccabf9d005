"""The two stages of the write path as plain functions; tasks/ only wires them to Celery.

extract: episode → (only the messages not extracted yet) → ExtractionResult, as a JSON-able payload.
persist: that payload → one Neo4j transaction, together with the session's extraction progress.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.extraction import extract
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.graph.params import window_texts
from worker.llm.client import LLMClient
from worker.llm.embeddings import Embedder, pack
from worker.models import Entity, Episode, EpisodeRecord, Message, Relationship, SessionProgress
from worker.settings import Settings

PAYLOAD_VERSION = 1


def progress_key(user_id: str, session_id: str) -> str:
    return "sp_" + hashlib.sha256(f"{user_id}\x1f{session_id}".encode()).hexdigest()[:32]


def messages_digest(messages: Sequence[Message]) -> str:
    canonical = json.dumps([[m.role, m.content] for m in messages], ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Plan:
    new: list[Message]
    context: list[Message]
    progress: SessionProgress


def plan(episode: Episode, done: tuple[int, str] | None, context_size: int) -> Plan | None:
    """Which messages to extract: those after the session's extracted prefix (if the prefix is unchanged).
    None when every message is already extracted (the same history sent again)."""
    messages = list(episode.messages)
    start = 0
    if done is not None:
        count, digest = done
        if 0 < count <= len(messages) and messages_digest(messages[:count]) == digest:
            start = count
    if start == len(messages):
        return None
    progress = SessionProgress(
        key=progress_key(episode.user_id, episode.session_id),
        user_id=episode.user_id,
        session_id=episode.session_id,
        extracted=len(messages),
        digest=messages_digest(messages),
    )
    return Plan(messages[start:], messages[max(0, start - context_size) : start], progress)


def conversation_text(messages: Sequence[Message]) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The stored text of messages (`role: content` lines) and where each message stands in it."""
    lines = [f"{m.role}: {m.content}" for m in messages]
    spans, start = [], 0
    for line in lines:
        spans.append((start, start + len(line)))
        start += len(line) + 1
    return "\n".join(lines), tuple(spans)


def episode_payload(episode: Episode) -> dict[str, Any]:
    return {"v": PAYLOAD_VERSION, "episode": episode.model_dump(mode="json")}


def extract_stage(
    payload: dict[str, Any],
    *,
    settings: Settings,
    store: Neo4jGraphStore,
    llm: LLMClient | None,
    embedder: Embedder | None = None,
) -> dict[str, Any]:
    episode = Episode.model_validate(payload["episode"])
    base = {"episode_id": episode.id, "user_id": episode.user_id}
    todo = plan(
        episode,
        store.session_progress(episode.user_id, progress_key(episode.user_id, episode.session_id)),
        settings.extract_context_messages,
    )
    if todo is None:
        return {**base, "status": "unchanged"}
    extraction = extract(todo.new, settings=settings, llm=llm, context=todo.context, episode_id=episode.id)
    content, spans = conversation_text(todo.new)
    vectors: tuple[str, ...] = ()
    if settings.embedding_model and settings.store_content:
        embedder = embedder or Embedder(settings)
        vectors = tuple(pack(v) for v in embedder.embed(window_texts(content, spans), query=False))
    record = EpisodeRecord(
        id=episode.id,
        user_id=episode.user_id,
        session_id=episode.session_id,
        summary=extraction.result.summary,
        content=content if settings.store_content else None,
        occurred_at=episode.occurred_at,
        extraction=extraction.kind,
        model=extraction.model,
        prompt_version=extraction.prompt_version,
        message_count=len(todo.new),
        llm_calls=extraction.usage.calls,
        prompt_tokens=extraction.usage.prompt_tokens,
        completion_tokens=extraction.usage.completion_tokens,
        cost_usd=extraction.usage.cost_usd,
        message_spans=spans if settings.store_content else (),
        window_vectors=vectors,
    )
    return {
        **base,
        "status": "extracted",
        "record": record.model_dump(mode="json"),
        "entities": [e.model_dump() for e in extraction.result.entities],
        "relationships": [r.model_dump() for r in extraction.result.relationships],
        "progress": todo.progress.model_dump(),
    }


def persist_stage(payload: dict[str, Any], *, store: Neo4jGraphStore) -> dict[str, Any]:
    base = {"episode_id": payload["episode_id"], "user_id": payload["user_id"]}
    if payload.get("status") != "extracted":
        return {**base, "status": payload.get("status", "unchanged")}  # unchanged or dead-lettered upstream
    result = store.save_episode(
        EpisodeRecord.model_validate(payload["record"]),
        [Entity.model_validate(e) for e in payload["entities"]],
        [Relationship.model_validate(r) for r in payload["relationships"]],
        SessionProgress.model_validate(payload["progress"]),
    )
    return {**base, "status": "persisted", "created": result.created}
