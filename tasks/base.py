"""The base of both stage tasks: bounded deliveries, retries and dead letters around a stage function."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

from celery import Task
from celery.exceptions import Retry
from celery.worker.request import Request

from tasks.end import TaskEnd
from tasks.policy import retry_delay_s
from worker import erasure, keys
from worker.celery_app import args_repr
from worker.deadletter import Stage, record_id
from worker.graph.forget import tombstones
from worker.identity import user_tag
from worker.runtime import Runtime, runtime
from worker.sessions import erased_since

log = logging.getLogger(__name__)

DELIVERY_KEY_TTL_S = 7 * 86_400


def _episode_id(payload: dict[str, Any]) -> str:
    return str(payload.get("episode_id") or (payload.get("episode") or {}).get("id", ""))


class QuietRequest(Request):  # type: ignore[misc]
    """A task request whose success event does not carry the task's return value.

    Celery puts `saferepr(result)` in every task-succeeded event, even with ignore_result; the extract
    stage returns the extraction (summary, content) and Flower may keep events on disk, beyond the reach
    of an erasure. The event keeps its ids and runtime."""

    def send_event(self, type: str, **fields: Any) -> None:
        if "result" in fields:
            fields["result"] = "<not shown>"
        super().send_event(type, **fields)


class StageTask(Task):  # type: ignore[misc]
    stage: Stage = "extract"
    max_retries = None  # Celery's own limit is off: tasks/policy.py decides when to give up
    Request = QuietRequest
    resultrepr_maxsize = 64  # Celery reprs every result (an extraction is large); neither logs nor events show it

    def guarded(self, payload: dict[str, Any], body: Callable[[Runtime, TaskEnd], dict[str, Any]]) -> dict[str, Any]:
        """Run body; retry transient failures with backoff; dead-letter permanent ones, exhausted retries
        and messages delivered max_deliveries times without finishing (they keep killing their worker).
        The dead letter is written before this returns, so before the message is acknowledged. What the
        body and the dead letter leave to write at the end (tasks/end.py) is sent after all of that, once."""
        rt = runtime()
        request = self.request
        episode_id = _episode_id(payload)
        end = TaskEnd(keys.deliveries(request.id, request.retries or 0))
        pipe = rt.redis.pipeline(transaction=False)  # one round trip: the episode is alive, this delivery counted
        rt.inflight.touch(episode_id, time.time(), pipe)
        pipe.incr(end.delivery_key)
        pipe.expire(end.delivery_key, DELIVERY_KEY_TTL_S)
        deliveries = int(pipe.execute()[1])
        if deliveries > rt.settings.max_deliveries:
            message = f"delivered {deliveries - 1} times without finishing (worker lost each time)"
            outcome = self._dead_letter(rt, payload, "DeliveryLimitExceeded", message, "", end)
        else:
            outcome = self._run(rt, payload, body, end)
        self.finish(outcome, end)
        self._send(rt, end)
        return outcome

    def _run(
        self, rt: Runtime, payload: dict[str, Any], body: Callable[[Runtime, TaskEnd], dict[str, Any]], end: TaskEnd
    ) -> dict[str, Any]:
        request = self.request
        episode_id = _episode_id(payload)
        try:
            return body(rt, end)
        except Retry:
            raise
        except Exception as exc:
            delay = retry_delay_s(exc, request.retries or 0, rt.settings)
            if delay is None:
                return self._dead_letter(rt, payload, type(exc).__name__, str(exc), traceback.format_exc(), end)
            log.warning(
                "stage failed; retrying",
                extra={
                    "stage": self.stage,
                    "episode_id": episode_id,
                    "error_class": type(exc).__name__,
                    "attempt": request.retries,
                    "delay_s": round(delay, 2),
                },
            )
            self._send(rt, end)  # this attempt's delivery counter, and what it counted before it failed
            rt.inflight.touch(episode_id, time.time() + delay)
            # A retry is a new message: without argsrepr Celery would put the payload in its events.
            retry_repr = args_repr(self.name, episode_id)
            raise self.retry(exc=exc, countdown=delay, argsrepr=retry_repr, kwargsrepr="{}") from exc

    def finish(self, outcome: dict[str, Any], end: TaskEnd) -> None:
        """The task's last word on an outcome (the extract task stores a final one for the caller)."""

    def _send(self, rt: Runtime, end: TaskEnd) -> None:
        """The task's end (tasks/end.py): the stage is over and is never retried for a failure of it."""
        end.send(rt.redis, rt.inflight, self.backend, rt.stats)

    def _dead_letter(
        self, rt: Runtime, payload: dict[str, Any], error_class: str, message: str, trace: str, end: TaskEnd
    ) -> dict[str, Any]:
        episode_id = _episode_id(payload)
        user_id = payload.get("user_id") or (payload.get("episode") or {}).get("user_id", "")
        if _erased_after_acceptance(rt, payload, user_id):  # no dead letter keeps an erased user's text
            return self._forgotten(episode_id, user_id, end)
        rt.dead_letters.add(
            stage=self.stage,
            task_name=self.name,
            task_id=self.request.id,
            episode_id=episode_id,
            user_id=user_id,
            payload=payload,
            error_class=error_class,
            message=message,
            traceback=trace,
            attempts=(self.request.retries or 0) + 1,
        )
        if _erased_after_acceptance(rt, payload, user_id):  # erased while the record was written: the
            rt.dead_letters.remove(record_id(self.stage, episode_id))  # erasure's purge may have run before it
            return self._forgotten(episode_id, user_id, end)
        end.done(episode_id)  # the dead-letter store holds it now
        log.error(
            "episode dead-lettered",
            extra={"stage": self.stage, "episode_id": episode_id, "error_class": error_class},
        )
        return {"episode_id": episode_id, "user_id": user_id, "status": "dead_lettered"}

    def redelivered(self, outcome: dict[str, Any], recovered: bool = False) -> dict[str, Any]:
        """An outcome `unchanged` because this very send is stored: on a message delivered again (its worker
        died or was taken for lost) or published again by the in-flight sweep (`recovered`), its earlier
        delivery wrote it, and the caller's wait() must say persisted (a second send of it stays unchanged).
        Only for that case: a send that another, longer send of its session covered stays unchanged,
        redelivered or not."""
        again = recovered or (self.request.delivery_info or {}).get("redelivered")
        if outcome.get("status") == "unchanged" and again:
            return {**outcome, "status": "persisted"}
        return outcome

    def _forgotten(self, episode_id: str, user_id: str, end: TaskEnd) -> dict[str, Any]:
        end.done(episode_id)
        log.warning("erased user's episode dropped", extra={"stage": self.stage, "episode_id": episode_id})
        return {"episode_id": episode_id, "user_id": user_id, "status": "forgotten"}


def _erased_after_acceptance(rt: Runtime, payload: dict[str, Any], user_id: str) -> bool:
    """Was the user erased, or this episode or its session forgotten, after the work was accepted?"""
    if not user_id:
        return False
    accepted = payload.get("accepted_at", (payload.get("record") or {}).get("accepted_at"))
    session = (payload.get("episode") or payload.get("record") or {}).get("session_id")
    keys = tombstones(user_id, _episode_id(payload), str(session) if session else None)
    at = max(erasure.erased_at(rt.redis, user_tag(user_id)) or 0.0, erasure.forgotten_at(rt.redis, keys))
    return erased_since(accepted, at)
