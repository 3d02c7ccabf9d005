"""What MemoryClient offers on a user's memory as a whole: export it, import it, extract it again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from api_stub.portability import ImportReport
    from api_stub.reextract import ReextractPlan, ReextractReport
    from worker.graph.neo4j_store import Neo4jGraphStore
    from worker.settings import Settings

audit = logging.getLogger("memory.audit")
_BULK_LOCK = threading.Lock()


class MemoryTransfer:
    """Part of MemoryClient, which gives the settings. Bulk work (export, import, re-extraction's choice) has
    a graph store of its own with the write path's timeouts and retries, not recall's budget-bound ones."""

    _settings: Settings
    _bulk: Neo4jGraphStore | None = None

    def _bulk_store(self) -> Neo4jGraphStore:
        with _BULK_LOCK:  # one store for the client, however many threads ask at once
            if self._bulk is None:
                from worker.graph.neo4j_store import Neo4jGraphStore

                self._bulk = Neo4jGraphStore.from_settings(self._settings)
            return self._bulk

    def _close_bulk(self) -> None:
        with _BULK_LOCK:
            bulk, self._bulk = self._bulk, None
        if bulk is not None:
            bulk.close()

    def export_user(self, user_id: str) -> Iterator[str]:
        """Everything kept about the user, as JSON Lines (api_stub/export_format.py), read from Neo4j in pages
        as the lines are consumed. The header is read at once (a store that is down raises here)."""
        from api_stub.export_lines import export_lines
        from api_stub.recall import check_user_id

        user_id = check_user_id(user_id)
        lines = export_lines(self._bulk_store(), user_id, self._settings.embedding_model)
        first = next(lines)  # the header: a store that is down fails here, before any line is handed out

        def rest() -> Iterator[str]:
            yield first
            count = 1
            for line in lines:
                count += 1
                yield line
            audit.info("export", extra={"event": "export", "user_id": user_id, "lines": count})

        return rest()

    def import_memory(
        self, path: Path, *, as_user: str | None = None, advance: Callable[[int], None] | None = None
    ) -> ImportReport:
        """Load an export into this deployment without an LLM call; idempotent; a bad line (ImportRejected,
        naming it) stops it before anything is written. See api_stub/portability.py."""
        from api_stub.portability import import_file
        from api_stub.recall import check_user_id

        target = check_user_id(as_user) if as_user is not None else None
        report = import_file(
            self._bulk_store(),
            path,
            as_user=target,
            store_content=self._settings.store_content,
            embedding_model=self._settings.embedding_model,
            advance=advance or (lambda _n: None),
        )
        audit.info("import", extra={"event": "import", "user_id": report.user_id, **report.model_dump()})
        return report

    def reextract_plan(
        self, user_id: str | None, *, only_degraded: bool = False, older_than: str | None = None
    ) -> ReextractPlan:
        """What reextract() would take (episodes, LLM calls, tokens, cost); nothing is sent."""
        from api_stub import reextract

        return reextract.plan(self._settings, self._chosen(user_id, only_degraded, older_than))

    def reextract(
        self,
        user_id: str | None,
        *,
        only_degraded: bool = False,
        older_than: str | None = None,
        advance: Callable[[int], None] | None = None,
    ) -> ReextractReport:
        """Extract stored episodes again with the current model and prompt, through the queue (user_id None:
        every user's); each one's old extraction is replaced exactly. See api_stub/reextract.py."""
        from api_stub import reextract

        rows = self._chosen(user_id, only_degraded, older_than)
        report = reextract.enqueue(self, rows, advance=advance or (lambda _n: None))
        audit.info("reextract", extra={"event": "reextract", "user_id": user_id, **report.model_dump()})
        return report

    def _chosen(self, user_id: str | None, only_degraded: bool, older_than: str | None) -> Iterator[dict[str, Any]]:
        from api_stub import reextract
        from api_stub.recall import check_user_id

        user = check_user_id(user_id) if user_id is not None else None
        return reextract.chosen(self._bulk_store(), user, only_degraded=only_degraded, older_than=older_than)
