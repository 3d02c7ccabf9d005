"""Episodes accepted but not finished yet, so that none can be lost on the way.

kombu's Redis transport pops a message (BRPOP) before it records it as unacknowledged: a worker that dies
in between takes that message with it. Every accepted episode is therefore recorded here with its payload;
each stage attempt refreshes its timestamp and the final outcome (persisted, unchanged, dead-lettered)
removes it. The sweep re-enqueues what is left only when the broker holds no message at all (both queues
empty, nothing unacknowledged, which includes retries waiting for their countdown): then no message can
exist for those episodes, so they were lost. A backlog is never mistaken for a loss.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from worker import keys


class InFlight:
    def __init__(self, redis: Any) -> None:
        self._redis = redis

    def close(self) -> None:
        """Close its Redis client (only for a client of its own, as MemoryClient's)."""
        self._redis.close()

    def add(self, episode_id: str, user_id: str, payload: dict[str, Any], at: float | None = None) -> None:
        record = json.dumps({"user_id": user_id, "payload": payload}, ensure_ascii=False)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(keys.INFLIGHT_PAYLOADS, episode_id, record)
        pipe.zadd(keys.INFLIGHT_INDEX, {episode_id: time.time() if at is None else at})
        pipe.execute()

    def touch(self, episode_id: str, at: float, pipe: Any = None) -> None:
        """Only for episodes still in flight (XX): a late attempt never resurrects a finished one. With
        `pipe`, the command is queued on that pipeline (the caller executes it)."""
        (pipe if pipe is not None else self._redis).zadd(keys.INFLIGHT_INDEX, {episode_id: at}, xx=True)

    def done(self, episode_id: str, pipe: Any = None) -> None:
        """The episode is finished. With `pipe`, the commands are queued on that pipeline (the caller executes
        it): the index entry goes first, so a reader never finds one without its payload."""
        own = pipe is None
        if own:
            pipe = self._redis.pipeline(transaction=True)
        pipe.zrem(keys.INFLIGHT_INDEX, episode_id)
        pipe.hdel(keys.INFLIGHT_PAYLOADS, episode_id)
        if own:
            pipe.execute()

    def payload(self, episode_id: str) -> dict[str, Any] | None:
        """The accepted episode's extract payload, while it is in flight."""
        raw = self._redis.hget(keys.INFLIGHT_PAYLOADS, episode_id)
        return None if raw is None else dict(json.loads(raw)["payload"])

    def count(self) -> int:
        return int(self._redis.zcard(keys.INFLIGHT_INDEX))

    def overdue(self, silent_for_s: float, limit: int = 500) -> list[tuple[str, dict[str, Any]]]:
        ids = self._redis.zrangebyscore(keys.INFLIGHT_INDEX, "-inf", time.time() - silent_for_s, start=0, num=limit)
        out = []
        for raw_id in ids:
            episode_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            raw = self._redis.hget(keys.INFLIGHT_PAYLOADS, episode_id)
            if raw is None:
                self.done(episode_id)
                continue
            out.append((episode_id, json.loads(raw)["payload"]))
        return out

    def purge_user(
        self,
        user_id: str,
        accepted_until: float | None = None,
        only: Callable[[str, dict[str, Any]], bool] | None = None,
    ) -> int:
        """Remove the user's records (only those accepted up to `accepted_until` when given: an episode sent
        after an erasure began is the user's new memory and keeps its record; only those for which
        only(episode id, payload) holds, when given)."""
        removed = 0
        for raw_id, raw in self._redis.hscan_iter(keys.INFLIGHT_PAYLOADS, count=500):
            record = json.loads(raw)
            if record["user_id"] != user_id:
                continue
            payload = record["payload"]
            episode_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            if only is not None and not only(episode_id, payload):
                continue
            accepted = payload.get("accepted_at", (payload.get("record") or {}).get("accepted_at"))
            if accepted_until is None or (accepted or 0.0) <= accepted_until:
                self.done(episode_id)
                removed += 1
        return removed

    def broker_idle(self) -> bool:
        """No message queued (any priority) and none held unacknowledged by a worker."""
        pipe = self._redis.pipeline(transaction=False)
        for queue in keys.QUEUES:
            for name in keys.queue_lists(queue):
                pipe.llen(name)
        pipe.hlen(keys.KOMBU_UNACKED)
        return not any(pipe.execute())

    def sweep(self, silent_for_s: float, enqueue: Any, lock_ttl_s: int = 120) -> int:
        """Re-enqueue episodes silent for longer than silent_for_s, if the broker is idle; one sweeper at a
        time (Redis lock). silent_for_s only keeps the sweep away from episodes being accepted right now."""
        if not self._redis.set(keys.INFLIGHT_SWEEP_LOCK, "1", nx=True, ex=lock_ttl_s):
            return 0
        try:
            if not self.broker_idle():
                return 0
            sent = 0
            for episode_id, payload in self.overdue(silent_for_s):
                if enqueue(payload) is not None:  # None: found final, and closed
                    self.touch(episode_id, time.time())
                    sent += 1
            return sent
        finally:
            self._redis.delete(keys.INFLIGHT_SWEEP_LOCK)
