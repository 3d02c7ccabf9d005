"""What the rest of the service needs from a graph store; tests are written against this."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from worker.models import (
    DeleteReport,
    Entity,
    EpisodeRecord,
    MemoryContext,
    Relationship,
    SaveResult,
    SessionProgress,
    StoreStats,
)
from worker.sessions import WriteState
from worker.timeframe import Period


class GraphStore(Protocol):
    def ensure_schema(self) -> None:
        """Create constraints and indexes if missing and wait until they are online. Idempotent."""

    def save_episodes(
        self,
        writes: Sequence[tuple[EpisodeRecord, Sequence[Entity], Sequence[Relationship]]],
        progress: Sequence[SessionProgress | None] | None = None,
    ) -> list[SaveResult]:
        """Persist episodes with their entities, relationships and session lines in one transaction.
        Idempotent: an episode already stored is left as it is. Each result's outcome says why an
        episode was not written (erased user, session already holding it or moved, id conflict)."""

    def write_state(self, user_id: str, key: str, episode_id: str) -> WriteState:
        """The session's line, the user's last erasure and an episode stored under this id (one read)."""

    def mark_erased(self, user_id: str, at: float, erasing_for_s: float = 600.0) -> str:
        """Record an erasure: work for the user accepted before `at` is never written; persists wait until
        erasure_done(user_id, the token returned)."""

    def erasure_done(self, user_id: str, token: str) -> None:
        """The erasure that returned `token` has finished deleting."""

    def search(
        self,
        user_id: str,
        keywords: Sequence[str],
        text: str,
        limit: int,
        timeout_s: float | None = None,
        period: Period | None = None,
        vector: Sequence[float] | None = None,
        as_of: datetime | None = None,
        expansion: Sequence[str] = (),
    ) -> MemoryContext:
        """The user's most relevant episodes for the keywords and text (favouring those that happened in
        `period`, and close in meaning to `vector` when embeddings are configured), with the passages
        that matched, their entities and relations."""

    def delete_user(self, user_id: str, window: str | None = None, erasing_for_s: float = 600.0) -> DeleteReport:
        """Remove every node and relationship of the user; returns what was removed."""

    def is_available(self, timeout_s: float = 2.0) -> bool:
        """A real round trip to the store, bounded by timeout_s."""

    def stats(self, user_id: str | None = None) -> StoreStats:
        """Counts for the whole store, or for one user."""

    def close(self) -> None:
        """Release connections."""
