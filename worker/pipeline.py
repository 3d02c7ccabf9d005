"""The two stages of the write path as plain functions; tasks/ only wires them to Celery.

extract: episode → (only the messages not extracted yet) → ExtractionResult, as a JSON-able payload.
persist: that payload → one Neo4j transaction, together with the session's extraction progress.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from worker.errors import SessionMovedError, StoreUnavailable
from worker.extraction import Extraction, extract
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.graph.params import window_texts
from worker.known_facts import KnownFact, ended_facts, known_facts
from worker.llm.client import LLMClient
from worker.llm.embeddings import Embedder, pack
from worker.models import Entity, Episode, EpisodeRecord, Message, Relationship, SaveResult, SessionProgress
from worker.offline import MODEL_NAME as OFFLINE
from worker.sessions import (
    StoredLine,
    WriteState,
    erased_since,
    extracted_prefix,
    message_hashes,
    messages_digest,
    progress_key,
)
from worker.settings import Settings

log = logging.getLogger(__name__)

PAYLOAD_VERSION = 1
REPLANS = 3  # extractions again in one persist when the session's line keeps moving (then: retry later)


@dataclass(frozen=True)
class Plan:
    new: list[Message]
    context: list[Message]
    progress: SessionProgress


def plan(episode: Episode, line: StoredLine | None, context_size: int, erased_at: float = 0.0) -> Plan | None:
    """Which messages to extract: those after the longest prefix the session already extracted. None when
    the session holds every message of this send (the same history sent again, or a shorter one)."""
    messages = list(episode.messages)
    hashes = message_hashes(messages)
    start = extracted_prefix(line, messages, hashes)
    if start == len(messages):
        return None
    progress = SessionProgress(
        key=progress_key(episode.user_id, episode.session_id),
        user_id=episode.user_id,
        session_id=episode.session_id,
        extracted=len(messages),
        digest=messages_digest(messages),
        hashes=hashes,
        start=start,
        erased_at=erased_at,
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


def episode_payload(episode: Episode, accepted_at: float | None = None) -> dict[str, Any]:
    """The message of an episode's extract stage; accepted_at (now by default) is when the caller handed it
    over, compared with the user's erasures."""
    return {
        "v": PAYLOAD_VERSION,
        "episode": episode.model_dump(mode="json"),
        "accepted_at": time.time() if accepted_at is None else accepted_at,
    }


def extract_stage(
    payload: dict[str, Any],
    *,
    settings: Settings,
    store: Neo4jGraphStore,
    llm: LLMClient | None,
    embedder: Embedder | None = None,
    read_state: Callable[[str, str, str], WriteState] | None = None,
) -> dict[str, Any]:
    """read_state: the read made before the model is called (store.write_state by default; a worker's
    shares queries between its threads: worker/graph/state_reads.py)."""
    episode = Episode.model_validate(payload["episode"])
    base = {"episode_id": episode.id, "user_id": episode.user_id}
    accepted_at = payload.get("accepted_at")
    digest = messages_digest(episode.messages)
    read = read_state or store.write_state
    state = read(episode.user_id, progress_key(episode.user_id, episode.session_id), episode.id)
    if erased_since(accepted_at, max(state.erased_at, state.forgotten_at)):
        return {**base, "status": "forgotten"}  # erased or forgotten after this was accepted: no model call
    if state.episode_digest and state.episode_user == episode.user_id:
        if state.episode_digest != digest:
            return {**base, "status": "conflict"}  # this id is stored with other content
        # this very send is stored already (sent again, or redelivered: then tasks/ report it persisted)
        return {**base, "status": "unchanged", "stored": True}
    todo = plan(episode, state.line, settings.extract_context_messages, state.erased_at)
    if todo is None:
        return {**base, "status": "unchanged"}
    known = _known_facts(episode.user_id, todo.new, settings, store)
    extraction = extract(todo.new, settings=settings, llm=llm, context=todo.context, episode_id=episode.id, known=known)
    content, spans = conversation_text(todo.new)
    vectors: tuple[str, ...] = ()
    if settings.embedding_model and settings.store_content:
        embedder = embedder or Embedder(settings)
        vectors = tuple(pack(v) for v in embedder.embed(window_texts(content, spans), query=False))
    record = _record(episode, extraction, content, spans, settings).model_copy(
        update={
            "window_vectors": vectors,
            "source_digest": digest,
            "accepted_at": accepted_at,
            "ended_facts": ended_facts(extraction.result, known),
        }
    )
    return {
        **base,
        "status": "extracted",
        "record": record.model_dump(mode="json"),
        "entities": [e.model_dump() for e in extraction.result.entities],
        "relationships": [r.model_dump() for r in extraction.result.relationships],
        "progress": todo.progress.model_dump(),
    }


def _known_facts(
    user_id: str, messages: Sequence[Message], settings: Settings, store: Neo4jGraphStore
) -> list[KnownFact]:
    """The user's current facts about what the new messages name, offered to the model with ids (none for the
    offline extractor, which never ends a fact: no read on its path)."""
    if settings.llm_model == OFFLINE or settings.extract_known_facts == 0:
        return []
    text = "\n".join(m.content for m in messages)
    return known_facts(store.current_facts(user_id, text, settings.extract_known_facts))


def _record(
    episode: Episode, extraction: Extraction, content: str, spans: tuple[tuple[int, int], ...], settings: Settings
) -> EpisodeRecord:
    """The episode as stored, with this extraction (the caller adds what depends on the send)."""
    return EpisodeRecord(
        id=episode.id,
        user_id=episode.user_id,
        session_id=episode.session_id,
        summary=extraction.result.summary,
        content=content if settings.store_content else None,
        occurred_at=episode.occurred_at,
        extraction=extraction.kind,
        model=extraction.model,
        prompt_version=extraction.prompt_version,
        message_count=len(spans),
        llm_calls=extraction.usage.calls,
        prompt_tokens=extraction.usage.prompt_tokens,
        completion_tokens=extraction.usage.completion_tokens,
        cost_usd=extraction.usage.cost_usd,
        dropped_entities=extraction.dropped.entities,
        dropped_relationships=extraction.dropped.relationships,
        windows=extraction.windows,
        message_spans=spans if settings.store_content else (),
    )


def reextract_stage(
    payload: dict[str, Any], *, settings: Settings, store: Neo4jGraphStore, llm: LLMClient | None
) -> dict[str, Any]:
    """A stored episode extracted again with the current model and prompt (memctl reextract): its messages
    are those of its stored content; no session line is planned or moved. Gone, or its user erased or it
    forgotten since this was asked for: `forgotten`, with no model call."""
    episode = Episode.model_validate(payload["episode"])
    base = {"episode_id": episode.id, "user_id": episode.user_id}
    state = store.write_state(episode.user_id, progress_key(episode.user_id, episode.session_id), episode.id)
    if state.episode_user is None or erased_since(payload.get("accepted_at"), max(state.erased_at, state.forgotten_at)):
        return {**base, "status": "forgotten"}
    if state.episode_user != episode.user_id:
        return {**base, "status": "conflict"}
    extraction = extract(list(episode.messages), settings=settings, llm=llm, episode_id=episode.id)
    content, spans = conversation_text(episode.messages)
    record = _record(episode, extraction, content, spans, settings).model_copy(
        update={"accepted_at": payload.get("accepted_at")}
    )
    return {
        **base,
        "status": "extracted",
        "reextract": payload["reextract"],
        "record": record.model_dump(mode="json"),
        "entities": [e.model_dump() for e in extraction.result.entities],
        "relationships": [r.model_dump() for r in extraction.result.relationships],
    }


# Outcomes of the persist transaction, as the caller's wait() reports them.
_STATUS = {"created": "persisted", "exists": "persisted", "forgotten": "forgotten", "unchanged": "unchanged"}


def persist_stage(
    payload: dict[str, Any],
    *,
    save: Callable[..., SaveResult],
    extract_again: Callable[[str], dict[str, Any] | None] | None = None,
    replace: Callable[..., SaveResult] | None = None,
) -> dict[str, Any]:
    """Save an extraction with `save` (Neo4jGraphStore.save_episode, or GroupCommit.save). When the session's
    line moved since it was planned (another send of the session persisted in between), extract_again(source
    digest) gives a fresh extraction of that very send (from the accepted episode) and that is saved instead,
    so a message is not extracted into the graph twice. When the send is no longer at hand (a replayed dead
    letter), the extraction is saved as it is, leaving the line: a message counted twice rather than lost."""
    base = {"episode_id": payload["episode_id"], "user_id": payload["user_id"]}
    if payload.get("reextract") and payload.get("status") == "extracted":
        if replace is None:
            raise ValueError("a re-extraction needs replace (Neo4jGraphStore.replace_extraction)")
        result = replace(
            EpisodeRecord.model_validate(payload["record"]),
            [Entity.model_validate(e) for e in payload["entities"]],
            [Relationship.model_validate(r) for r in payload["relationships"]],
            str(payload["reextract"]),
        )
        if result.outcome == "erasing":
            raise StoreUnavailable("an erasure of this user is running; the episode is persisted after it")
        return {**base, "status": _STATUS[result.outcome], "created": result.created}
    check_line = True
    for _ in range(REPLANS + 1):
        if payload.get("status") != "extracted":  # unchanged, forgotten, conflict, dead-lettered upstream
            return {**base, "status": payload.get("status", "unchanged"), "created": False}
        record = EpisodeRecord.model_validate(payload["record"])
        result = save(
            record,
            [Entity.model_validate(e) for e in payload["entities"]],
            [Relationship.model_validate(r) for r in payload["relationships"]],
            SessionProgress.model_validate(payload["progress"]) if check_line else None,
        )
        if result.outcome == "erasing":  # transient: the stage retries once the erasure is done
            raise StoreUnavailable("an erasure of this user is running; the episode is persisted after it")
        if result.outcome == "conflict":
            return {**base, "status": "conflict", "created": False}
        if result.outcome != "moved":
            return {**base, "status": _STATUS[result.outcome], "created": result.created}
        fresh = extract_again(record.source_digest) if extract_again is not None and record.source_digest else None
        if fresh is None:  # the send is no longer in flight (or another send took its id)
            log.warning("session moved; saved without planning again", extra={"episode_id": record.id})
            check_line = False
            continue
        payload = fresh
    raise SessionMovedError(f"the session kept moving; extracted {REPLANS + 1} times")
