"""The two stage tasks of the write path, chained: extract (queue memory.extract) → persist (memory.persist)."""

from __future__ import annotations

from typing import Any

from tasks.base import StageTask
from worker.celery_app import EXTRACT_TASK, PERSIST_TASK, app
from worker.models import Episode
from worker.pipeline import extract_stage, persist_stage, reextract_stage
from worker.runtime import Runtime
from worker.sessions import messages_digest, progress_key


class ExtractTask(StageTask):
    stage = "extract"
    ignore_result = True  # its result (conversation text) travels to persist in the message, not the backend


class PersistTask(StageTask):
    stage = "persist"


def _extract(self: StageTask, payload: dict[str, Any]) -> dict[str, Any]:
    def body(rt: Runtime) -> dict[str, Any]:
        stage = reextract_stage if payload.get("reextract") else extract_stage  # memctl reextract
        outcome = stage(payload, settings=rt.settings, store=rt.store, llm=rt.llm)
        if outcome["status"] == "extracted":
            rt.stats.extracted(outcome["record"])
        return self.redelivered(outcome)

    return self.guarded(payload, body)


def _persist(self: StageTask, payload: dict[str, Any]) -> dict[str, Any]:
    def body(rt: Runtime) -> dict[str, Any]:
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
                rt.stats.extracted(fresh["record"])  # its model calls and cost count like any extraction
            return fresh

        outcome = persist_stage(
            payload, save=rt.group_commit.save, extract_again=extract_again, replace=rt.store.replace_extraction
        )
        if outcome["status"] == "unchanged" and _stored_by_this_send(rt, payload):
            outcome = {**outcome, "status": "persisted"}
        if outcome["status"] == "persisted" and outcome["created"] and not payload.get("reextract"):
            rt.stats.persisted()  # a re-extraction replaces an episode: it is not one more
        rt.inflight.done(outcome["episode_id"])  # final: persisted, unchanged, forgotten, conflict, dead-lettered
        return self.redelivered(outcome)

    return self.guarded(payload, body)


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
