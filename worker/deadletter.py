"""The dead-letter store (Redis): one self-sufficient record per failed episode stage, never expiring.

A record holds everything needed to replay it (for the persist stage, the extraction result too), so a
replay never calls the LLM again for an episode that was already extracted. Replay re-enqueues first and
removes the record only after the broker has accepted the new message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, Field

from worker import keys
from worker.identity import user_tag

Stage = Literal["extract", "persist"]
TRACEBACK_CHARS = 4000

log = logging.getLogger(__name__)


class DeadLetter(BaseModel):
    id: str
    stage: Stage
    task_name: str
    task_id: str
    episode_id: str
    user_id: str
    payload: dict[str, Any] = Field(repr=False)
    error_class: str
    message: str
    traceback: str = ""
    attempts: int = 1
    first_failed_at: float
    last_failed_at: float
    replay_count: int = 0


# Compare-and-delete of a dead letter (record, index entry, the user's set), atomic in Redis.
_DELETE_IF_UNCHANGED = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('SREM', KEYS[3], ARGV[2])
  return 1
end
return 0
"""


# Compare-and-set of a dead letter's record: a replay counts itself only on the record it read (one purged or
# forgotten meanwhile is not written back without its index and user set).
_SET_IF_UNCHANGED = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


def record_id(stage: Stage, episode_id: str) -> str:
    """One record per episode and stage: failing again updates it instead of piling up copies."""
    return f"{stage}:{episode_id}"


class DeadLetterStore:
    def __init__(self, redis: Any) -> None:
        self._redis = redis

    def add(
        self,
        *,
        stage: Stage,
        task_name: str,
        task_id: str,
        episode_id: str,
        user_id: str,
        payload: dict[str, Any],
        error_class: str,
        message: str,
        traceback: str = "",
        attempts: int = 1,
    ) -> DeadLetter:
        now = time.time()
        rid = record_id(stage, episode_id)
        previous = self.get(rid)
        other = previous.user_id if previous is not None and previous.user_id != user_id else None
        if other is not None:  # an explicit episode id another user sent too (one per deployment): this one kept
            previous = None
            log.warning("dead letter of another user replaced", extra={"record_id": rid})
        letter = DeadLetter(
            id=rid,
            stage=stage,
            task_name=task_name,
            task_id=task_id,
            episode_id=episode_id,
            user_id=user_id,
            payload=payload,
            error_class=error_class,
            message=message[:2000],
            traceback=traceback[-TRACEBACK_CHARS:],
            attempts=attempts + (previous.attempts if previous else 0),
            first_failed_at=previous.first_failed_at if previous else now,
            last_failed_at=now,
            replay_count=previous.replay_count if previous else 0,
        )
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(keys.dlq_record(rid), letter.model_dump_json())
        pipe.zadd(keys.DLQ_INDEX, {rid: letter.first_failed_at})
        pipe.sadd(keys.dlq_user(user_tag(user_id)), rid)
        if other is not None:  # no longer that user's: erasing them must not remove it
            pipe.srem(keys.dlq_user(user_tag(other)), rid)
        pipe.execute()
        return letter

    def get(self, rid: str) -> DeadLetter | None:
        raw = self._redis.get(keys.dlq_record(rid))
        return None if raw is None else DeadLetter.model_validate_json(raw)

    def ids(self, limit: int | None = None) -> list[str]:
        """Oldest first."""
        end = -1 if limit is None else limit - 1
        return [i.decode() if isinstance(i, bytes) else i for i in self._redis.zrange(keys.DLQ_INDEX, 0, end)]

    def list(self, limit: int | None = None) -> list[DeadLetter]:
        return [letter for rid in self.ids(limit) if (letter := self.get(rid)) is not None]

    def iter_all(self) -> Iterator[DeadLetter]:
        for rid in self.ids():
            letter = self.get(rid)
            if letter is not None:
                yield letter

    def count(self) -> int:
        return int(self._redis.zcard(keys.DLQ_INDEX))

    def oldest_age_s(self) -> float | None:
        first = self._redis.zrange(keys.DLQ_INDEX, 0, 0, withscores=True)
        return time.time() - float(first[0][1]) if first else None

    def remove(self, rid: str) -> bool:
        return self._remove(rid, self.get(rid))

    def _remove(self, rid: str, letter: DeadLetter | None) -> bool:
        """Remove the record `rid`, whose letter (None: gone) the caller has just read."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(keys.dlq_record(rid))
        pipe.zrem(keys.DLQ_INDEX, rid)
        if letter is not None:
            pipe.srem(keys.dlq_user(user_tag(letter.user_id)), rid)
        deleted = pipe.execute()[0]
        return bool(deleted)

    def replay(self, rid: str, enqueue: Callable[[DeadLetter], str]) -> str | None:
        """Re-enqueue (enqueue returns the new task id once the broker accepted it), then remove the record
        only if it is still the one replayed: a replay that failed again at once has written a new dead
        letter under the same id, and that one stays. None: no such record (or gone while it was read)."""
        letter = self.get(rid)
        if letter is None:
            return None
        bumped = letter.model_copy(update={"replay_count": letter.replay_count + 1})
        written = bumped.model_dump_json()
        # Counted even if we crash next; purged (forget_user, dlq purge) or replaced since it was read: not
        # replayed, and not written back.
        if not self._redis.eval(_SET_IF_UNCHANGED, 1, keys.dlq_record(rid), letter.model_dump_json(), written):
            return None
        task_id = enqueue(bumped)
        self._redis.eval(
            _DELETE_IF_UNCHANGED,
            3,
            keys.dlq_record(rid),
            keys.DLQ_INDEX,
            keys.dlq_user(user_tag(letter.user_id)),
            written,
            rid,
        )
        return task_id

    def purge_user(self, user_id: str, only: Callable[[DeadLetter], bool] | None = None) -> int:
        """Remove the user's records (only those for which only(record) holds, when given)."""
        members = self._redis.smembers(keys.dlq_user(user_tag(user_id)))
        removed = 0
        for member in members:
            rid = member.decode() if isinstance(member, bytes) else member
            letter = self.get(rid)
            if letter is not None and letter.user_id != user_id:
                continue  # another user's now (their send of the same explicit id came later)
            if only is None or (letter is not None and only(letter)):
                removed += int(self._remove(rid, letter))
        if only is None:
            self._redis.delete(keys.dlq_user(user_tag(user_id)))
        return removed
