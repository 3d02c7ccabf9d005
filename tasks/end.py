"""What a stage task writes to Redis once its stage is over, gathered while it runs and sent in one round trip.

- the episode's in-flight record marked done (the outcome is final);
- the delivery counter of this attempt deleted;
- the outcome stored where the caller's wait() looks for it, when the task stores it itself;
- its counts (extractions, LLM calls and cost, persisted episodes).

StageTask.guarded sends it after the stage's own error handling, never inside it, so a failure to send it
cannot retry or dead-letter a stage whose write already committed. The pipeline is not a transaction: Redis
runs each command on its own, and a refused count (say, under `noeviction` at maxmemory) fails only itself.
If a command that matters fails, or the round trip itself does, the writes are made again one by one (all
idempotent; the counts are not, so they are sent again only when the round trip failed, and may then count
twice, as the Redis client's own retry can): the outcome first, through Celery's own store_result and its
retry policy; only an outcome that cannot be stored at all fails the task. An in-flight record or delivery
counter left behind does no harm (the in-flight sweep finds the episode stored; the counter expires).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from celery import states

from worker.inflight import InFlight
from worker.stats import EPISODES_PERSISTED, Stats, extraction_counts, queue_counts

log = logging.getLogger(__name__)

# Celery's result backend never replaces a SUCCESS with a later state (a lost worker's late outcome must not
# overwrite the real one): the same rule as its store_result, in one atomic step instead of a GET and a SET.
_STORE_OUTCOME = """
local current = redis.call('GET', KEYS[1])
if current then
  local ok, meta = pcall(cjson.decode, current)
  if ok and type(meta) == 'table' and meta['status'] == 'SUCCESS' then return 0 end
end
if ARGV[2] == '0' then redis.call('SET', KEYS[1], ARGV[1]) else redis.call('SETEX', KEYS[1], ARGV[2], ARGV[1]) end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
"""


@dataclass
class TaskEnd:
    delivery_key: str
    counts: Counter[str] = field(default_factory=Counter)
    cost_usd: float = 0.0
    finished: list[str] = field(default_factory=list)  # episode ids whose in-flight record is done
    outcome: tuple[str, dict[str, Any]] | None = None  # (task id, outcome) stored as that task's SUCCESS

    def extracted(self, record: dict[str, Any]) -> None:
        counts, cost_usd = extraction_counts(record)
        self.counts.update(counts)
        self.cost_usd += cost_usd

    def persisted(self) -> None:
        self.counts[EPISODES_PERSISTED] += 1

    def done(self, episode_id: str) -> None:
        self.finished.append(episode_id)

    def store(self, task_id: str, outcome: dict[str, Any]) -> None:
        self.outcome = (task_id, outcome)

    def send(self, redis: Any, inflight: InFlight, backend: Any, stats: Stats) -> None:
        """Everything in one round trip. If a write that matters failed, or the round trip did, the writes
        are made again one by one (the counts only if the round trip failed: they may not have landed)."""
        pipe = redis.pipeline(transaction=False)
        for episode_id in self.finished:
            inflight.done(episode_id, pipe)
        pipe.delete(self.delivery_key)
        json_outcome = self.outcome if self.outcome is not None and _plain_json(backend) else None
        if json_outcome is not None:
            key, value = _stored(backend, *json_outcome)
            pipe.eval(_STORE_OUTCOME, 1, key, value, int(backend.expires or 0))  # 0: kept for ever
        required = len(pipe)
        queue_counts(pipe, dict(self.counts), self.cost_usd)
        try:
            replies = pipe.execute(raise_on_error=False)
        except Exception as exc:
            _step_by_step(exc, self.finished)
            self._each(inflight, redis, backend, stats if self.counts or self.cost_usd else None)
            return
        if any(isinstance(r, Exception) for r in replies[required:]):  # metrics never fail a write
            log.warning("could not count", extra={"error_class": _first_error(replies[required:])})
        failed = [r for r in replies[:required] if isinstance(r, Exception)]
        if failed:
            _step_by_step(failed[0], self.finished)
            self._each(inflight, redis, backend, None)
        elif self.outcome is not None and json_outcome is None:  # another serializer or compression: Celery stores it
            backend.store_result(self.outcome[0], self.outcome[1], states.SUCCESS)

    def _each(self, inflight: InFlight, redis: Any, backend: Any, stats: Stats | None) -> None:
        """The writes one by one (each is idempotent, so those the round trip made do no harm); with stats,
        the counts too. Raises only if the outcome cannot be stored (after trying the rest)."""
        refused: Exception | None = None
        if self.outcome is not None:
            try:
                backend.store_result(self.outcome[0], self.outcome[1], states.SUCCESS)
            except Exception as exc:
                refused = exc
        try:
            pipe = redis.pipeline(transaction=False)  # no MULTI: under noeviction Redis refuses a whole MULTI
            for episode_id in self.finished:
                inflight.done(episode_id, pipe)
            pipe.delete(self.delivery_key)
            pipe.execute()
        except Exception as exc:  # left for the in-flight sweep, which finds the episode stored
            log.warning(
                "in-flight record not marked done",
                extra={"error_class": type(exc).__name__, "episode_ids": self.finished},
            )
        if stats is not None:
            stats.add(dict(self.counts), self.cost_usd)  # never raises
        if refused is not None:
            raise refused


def _step_by_step(exc: BaseException, episode_ids: list[str]) -> None:
    log.warning(
        "task end not written in one round trip; writing it step by step",
        extra={"error_class": type(exc).__name__, "episode_ids": episode_ids},
    )


def _plain_json(backend: Any) -> bool:
    """The script reads the stored outcome as JSON: with another serializer or compression, Celery stores it."""
    return bool(backend.serializer == "json" and not backend.compression)


def _stored(backend: Any, task_id: str, outcome: dict[str, Any]) -> tuple[str, str]:
    """The key and value Celery's Redis backend stores a task's SUCCESS under (its own encoding)."""
    meta = backend._get_result_meta(result=outcome, state=states.SUCCESS, traceback=None, request=None)
    meta["task_id"] = task_id
    return backend.get_key_for_task(task_id).decode(), backend.encode(meta)


def _first_error(replies: list[Any]) -> str:
    return next(type(r).__name__ for r in replies if isinstance(r, Exception))
