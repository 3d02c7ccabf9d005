"""The two stage tasks of the write path, chained: extract (queue memory.extract) → persist (memory.persist).

With MEMORY_PERSIST_INLINE (the default) the extract task also writes its extraction, through the process's
group commit, and ends the chain there: one Celery task per episode. Only an extraction that write could not
store (Neo4j away, an erasure running, anything else) goes on to the persist task, which retries it with
backoff or dead-letters it as before, without asking the model again.
"""

from __future__ import annotations

import logging
from typing import Any

from tasks.base import StageTask
from tasks.end import TaskEnd
from worker.celery_app import EXTRACT_TASK, PERSIST_TASK, app, persist_task_id
from worker.models import Episode
from worker.pipeline import extract_stage, persist_stage, reextract_stage
from worker.runtime import Runtime, runtime
from worker.sessions import messages_digest, progress_key

log = logging.getLogger(__name__)


class ExtractTask(StageTask):
    stage = "extract"
    ignore_result = True  # its result (conversation text) travels to persist in the message, not the backend

    def finish(self, outcome: dict[str, Any], end: TaskEnd) -> None:
        """With inline persistence, an outcome other than an extraction is final in the extract task: stored
        where the caller's receipt (the persist task id) looks for it, and the chain stops here (Celery
        publishes the rest of request.chain after return). An extraction goes on to the persist task."""
        if outcome.get("status") != "extracted" and runtime().settings.persist_inline:
            self.request.chain = None
            end.store(persist_task_id(str(outcome["episode_id"])), outcome)


class PersistTask(StageTask):
    stage = "persist"


def _extract(self: StageTask, payload: dict[str, Any]) -> dict[str, Any]:
    def body(rt: Runtime, end: TaskEnd) -> dict[str, Any]:
        if payload.get("reextract"):  # memctl reextract
            outcome = reextract_stage(payload, settings=rt.settings, store=rt.store, llm=rt.llm)
        else:
            read = rt.group_read.write_state
            outcome = extract_stage(payload, settings=rt.settings, store=rt.store, llm=rt.llm, read_state=read)
        if outcome.pop("stored", False):  # this very send found stored (a redelivery: persisted)
            outcome = self.redelivered(outcome, recovered=bool(payload.get("recovered")))
        if outcome["status"] == "extracted":
            end.extracted(outcome["record"])
        if rt.settings.persist_inline:
            return _persist_inline(rt, outcome, end)
        return outcome

    return self.guarded(payload, body)


def _persist_inline(rt: Runtime, extraction: dict[str, Any], end: TaskEnd) -> dict[str, Any]:
    """The persist stage run in the extract task: the episode's final outcome (an upstream one such as
    `unchanged` passes through it), or, when that fails, the extraction itself, which the chain hands to the
    persist task (retries with backoff, dead letter, and no model call again)."""
    try:
        return _persisted(rt, extraction, end)
    except Exception as exc:
        log.warning(
            "inline persist failed; the persist queue takes it",
            extra={"episode_id": extraction["episode_id"], "error_class": type(exc).__name__},
        )
        return extraction


def _persist(self: StageTask, payload: dict[str, Any]) -> dict[str, Any]:
    return self.guarded(payload, lambda rt, end: _persisted(rt, payload, end))


def _persisted(rt: Runtime, payload: dict[str, Any], end: TaskEnd) -> dict[str, Any]:
    """An extraction (or an upstream outcome, passed through) written; its in-flight record done and its
    counts made at the task's end."""
    if payload.get("status") == "extracted":  # upstream outcomes (unchanged, dead-lettered) pass through
        rt.ensure_schema()

    def extract_again(source_digest: str) -> dict[str, Any] | None:
        """The same send extracted again against the session's line as it is now (from its in-flight
        record; None if it is gone or another send of the same id replaced it)."""
        accepted = rt.inflight.payload(payload["episode_id"])
        if (
            accepted is None
            or "episode" not in accepted  # a replayed persist: only its extraction is in flight
            or messages_digest(Episode.model_validate(accepted["episode"]).messages) != source_digest
        ):
            return None
        fresh = extract_stage(accepted, settings=rt.settings, store=rt.store, llm=rt.llm)
        if fresh["status"] == "extracted":
            end.extracted(fresh["record"])  # its model calls and cost count like any extraction
        return fresh

    outcome = persist_stage(
        payload, save=rt.group_commit.save, extract_again=extract_again, replace=rt.store.replace_extraction
    )
    if outcome["status"] == "unchanged" and _stored_by_this_send(rt, payload):
        outcome = {**outcome, "status": "persisted"}
    if outcome["status"] == "persisted" and outcome["created"] and not payload.get("reextract"):
        end.persisted()  # a re-extraction replaces an episode: it is not one more
    end.done(outcome["episode_id"])  # final: persisted, unchanged, forgotten, conflict, dead-lettered
    return outcome


def _stored_by_this_send(rt: Runtime, payload: dict[str, Any]) -> bool:
    """Is this very send stored (its id, with its digest)? An extraction found `unchanged` can be one whose
    earlier delivery persisted it: its extract message came back after a lost worker and was extracted again
    before that persist committed. The caller's wait() must then say persisted, not unchanged."""
    record = payload.get("record") or {}
    digest = record.get("source_digest")
    if payload.get("status") != "extracted" or not digest:
        return False
    user = str(record["user_id"])
    state = rt.store.write_state(user, progress_key(user, str(record["session_id"])), str(record["id"]))
    return state.episode_user == user and state.episode_digest == digest


extract_episode = app.task(bind=True, base=ExtractTask, name=EXTRACT_TASK)(_extract)
persist_episode = app.task(bind=True, base=PersistTask, name=PERSIST_TASK)(_persist)
