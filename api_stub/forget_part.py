"""forget_episode / forget_session: one episode, or one session, of a user removed everywhere it is kept.

Order: first the graph transaction (worker/graph/forget.py), which writes the tombstone under the user's lock
and takes back what the episodes added; from its commit on, work for them accepted before it (queued,
retrying, redelivered) is dropped by both stages and by the persist transaction. Then the tombstone's mirror
in Redis (the dead-letter path reads it), the in-flight and dead-letter records that hold the episodes'
text, and the user's cached recall keywords (they may name what was forgotten). Every step is idempotent, so
a failed forget is simply called again.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from worker import erasure
from worker.deadletter import DeadLetter, DeadLetterStore
from worker.erasure import purge_cached_keywords
from worker.errors import QueryRejected
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.inflight import InFlight
from worker.models import Identifier


class ForgetPartReport(BaseModel):
    """What a forget_episode or forget_session removed (all zeros when called again)."""

    user_id: str
    episode_id: str | None = None
    session_id: str | None = None
    episodes: int
    entities_removed: int  # no remaining episode mentions them
    entities_updated: int  # fewer mentions, description from a remaining episode
    relationships_removed: int  # no remaining episode supports them
    relationships_updated: int  # the forgotten episodes' weight taken back
    session_progress: int  # 1 when the session's extraction progress went (no episode of it remains)
    in_flight: int
    dead_letters: int
    cached_keywords: int


def forget_part(
    store: Neo4jGraphStore,
    redis: Any,
    user_id: str,
    *,
    episode_id: str | None = None,
    session_id: str | None = None,
) -> ForgetPartReport:
    """Exactly one of episode_id and session_id; ids are checked by the caller (check_user_id)."""
    which = "episode_id" if episode_id is not None else "session_id"
    if (episode_id is None) == (session_id is None):
        raise QueryRejected("give one episode id or one session id", which)
    try:  # checked and normalised as stored episodes' ids are
        checked = TypeAdapter(Identifier).validate_python(episode_id if episode_id is not None else session_id)
    except ValidationError as exc:
        raise QueryRejected(exc.errors()[0]["msg"], which) from None
    episode_id, session_id = (checked, None) if episode_id is not None else (None, checked)
    at = time.time()
    counts = store.forget(user_id, at, episode_id=episode_id, session_id=session_id)
    erasure.mark_forgotten(redis, list(counts.tombstones), at)

    def named(stored_episode_id: str, payload: dict[str, Any]) -> bool:
        if stored_episode_id == episode_id:
            return True
        episode = payload.get("episode") or payload.get("record") or {}
        return counts.session_forgotten is not None and episode.get("session_id") == counts.session_forgotten

    def accepted_before(payload: dict[str, Any]) -> bool:
        accepted = payload.get("accepted_at", (payload.get("record") or {}).get("accepted_at"))
        return (accepted or 0.0) <= at

    def letter_named(letter: DeadLetter) -> bool:
        return named(letter.episode_id, letter.payload) and accepted_before(letter.payload)

    in_flight = InFlight(redis).purge_user(user_id, accepted_until=at, only=named)
    dead_letters = DeadLetterStore(redis).purge_user(user_id, only=letter_named)
    cached = purge_cached_keywords(redis, user_id)
    return ForgetPartReport(
        user_id=user_id,
        episode_id=episode_id,
        session_id=session_id,
        episodes=counts.episodes,
        entities_removed=counts.entities_removed,
        entities_updated=counts.entities_updated,
        relationships_removed=counts.relationships_removed,
        relationships_updated=counts.relationships_updated,
        session_progress=counts.session_progress,
        in_flight=in_flight,
        dead_letters=dead_letters,
        cached_keywords=cached,
    )
