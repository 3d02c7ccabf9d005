"""Episodes accepted but not finished yet, so that none can be lost on the way.

kombu's Redis transport pops a message (BRPOP) before it records it as unacknowledged: a worker that dies
in between takes that message with it. Every accepted episode is therefore recorded here with its payload;
each stage attempt refreshes its timestamp and the final outcome (persisted, unchanged, dead-lettered)
removes it. The sweep re-enqueues what is left when no message can exist for it. With the broker idle (both queues
empty, nothing unacknowledged, which includes retries waiting for their countdown) that is every silent
episode. With the broker busy (steady traffic: it may never be idle), the sweep reads the messages the queues
and `unacked` hold (up to SCAN_LIMIT of them; a longer backlog waits for a later sweep) and takes a silent
episode none of them carries for a suspect; one still silent, and still carried by none, at the next sweep
was lost and is re-enqueued (the two looks cover a message between its BRPOP and kombu's record of it). A
backlog is never mistaken for a loss.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from worker import keys

SCAN_LIMIT = 20_000  # messages a busy-broker sweep reads at most
_EPISODE = re.compile(r"<(?:episode|extraction of) ([^>]+)>")  # in a message's argsrepr (worker/celery_app.py)


def _episode_of(message: Any) -> str | None:
    """The episode id a kombu message carries (its argsrepr header), None if unreadable."""
    try:
        found = _EPISODE.search(str((message.get("headers") or {}).get("argsrepr") or ""))
    except AttributeError:
        return None
    return found.group(1) if found else None


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
        pipe.hdel(keys.INFLIGHT_SUSPECTS, episode_id)
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

    def carried(self, limit: int = SCAN_LIMIT) -> set[str] | None:
        """The episodes some message in a queue or in `unacked` carries; None when they hold more than
        `limit` messages (not read). Queues first: a message taken meanwhile is in `unacked` when read."""
        lists = [name for queue in keys.QUEUES for name in keys.queue_lists(queue)]
        pipe = self._redis.pipeline(transaction=False)
        for name in lists:
            pipe.llen(name)
        pipe.hlen(keys.KOMBU_UNACKED)
        if sum(pipe.execute()) > limit:
            return None
        found: set[str | None] = set()
        for name in lists:
            found.update(_episode_of(_json(raw)) for raw in self._redis.lrange(name, 0, limit))
        for raw in self._redis.hvals(keys.KOMBU_UNACKED):
            held = _json(raw)
            found.add(_episode_of(held[0] if isinstance(held, list) and held else None))
        return {episode_id for episode_id in found if episode_id is not None}

    def lost(self, silent_for_s: float) -> list[tuple[str, dict[str, Any]]]:
        """Silent episodes no message can carry: all of them with the broker idle; with it busy, those no
        message carried at this sweep and the one before, silent all the while."""
        overdue = self.overdue(silent_for_s)
        if not overdue or self.broker_idle():
            return overdue
        carried = self.carried()
        if carried is None:  # a backlog too long to read: a later sweep looks again
            return []
        ids = [episode_id for episode_id, _ in overdue if episode_id not in carried]
        if not ids:
            return []
        scores = self._redis.zmscore(keys.INFLIGHT_INDEX, ids)
        seen = self._redis.hmget(keys.INFLIGHT_SUSPECTS, ids)
        confirmed = {
            i for i, now, then in zip(ids, scores, seen, strict=True) if then is not None and now == float(then)
        }
        suspects = {i: repr(now) for i, now in zip(ids, scores, strict=True) if i not in confirmed and now is not None}
        if suspects:
            self._redis.hset(keys.INFLIGHT_SUSPECTS, mapping=suspects)
        return [(episode_id, payload) for episode_id, payload in overdue if episode_id in confirmed]

    def sweep(self, silent_for_s: float, enqueue: Any, lock_ttl_s: int = 120) -> int:
        """Re-enqueue episodes silent for longer than silent_for_s that no message carries (lost); one
        sweeper at a time (Redis lock). silent_for_s only keeps the sweep away from episodes being accepted
        right now."""
        if not self._redis.set(keys.INFLIGHT_SWEEP_LOCK, "1", nx=True, ex=lock_ttl_s):
            return 0
        try:
            sent = 0
            for episode_id, payload in self.lost(silent_for_s):
                self._redis.hdel(keys.INFLIGHT_SUSPECTS, episode_id)
                if enqueue(payload) is not None:  # None: found final, and closed
                    self.touch(episode_id, time.time())
                    sent += 1
            return sent
        finally:
            self._redis.delete(keys.INFLIGHT_SWEEP_LOCK)


def _json(raw: Any) -> Any:
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return None
