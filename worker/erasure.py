"""The Redis side of an erasure mark: `forget_user` writes when it began (epoch seconds) under the user's tag.
Writers that could outlive an erasure check it before they keep anything of the user: the dead-letter path
(a stage failing for good after the erasure) and recall's late cache writes (a query embedding or LLM
keywords that finish after it)."""

from __future__ import annotations

import time
from typing import Any

from worker import keys
from worker.identity import user_tag

ERASURE_KEY_TTL_S = 7 * 86_400  # tombstones of forgotten episodes and sessions, and cache purges


def mark(redis: Any, tag: str, erased_at: float) -> None:
    """Kept with no expiry (one small key per erased user, under the hash of their id, as Neo4j's UserMark):
    work accepted before the erasure may still fail for good after any fixed time (a backlog older than it),
    and its dead letter must not keep the user's text then."""
    redis.set(keys.erasure_key(tag), repr(erased_at))


def erased_at(redis: Any, tag: str) -> float | None:
    raw = redis.get(keys.erasure_key(tag))
    return None if raw is None else float(raw)


_SET_LATER = """
local at = redis.call('GET', KEYS[1])
if at and tonumber(at) >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""


def mark_forgotten(redis: Any, tombstones: list[str], at: float) -> None:
    """An episode or session forgotten at `at` (its tombstones, worker/graph/forget.py); an earlier time
    never replaces a later one (two forgets at once)."""
    for tombstone in tombstones:
        redis.eval(_SET_LATER, 1, keys.forgotten_key(tombstone), repr(at), ERASURE_KEY_TTL_S)


def forgotten_at(redis: Any, tombstones: list[str]) -> float:
    """When the latest of these tombstones was written (0: never)."""
    values = redis.mget([keys.forgotten_key(t) for t in tombstones]) if tombstones else []
    return max((float(v) for v in values if v is not None), default=0.0)


# Check and write in one step: a write checked before an erasure's mark and landing after its cleanup scan
# would otherwise keep the user's data. With the script, a write either lands before the mark (and the scan,
# which starts after the mark, finds and deletes it) or sees the mark and writes nothing.
# The same holds for a purge of the user's caches when an episode or session is forgotten (KEYS[3]).
_SET_UNLESS_ERASED = """
for _, mark in ipairs({KEYS[1], KEYS[3]}) do
  local at = redis.call('GET', mark)
  if at and tonumber(at) >= tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
return 1
"""


def set_unless_erased(redis: Any, tag: str, started_at: float, key: str, value: str, ttl_s: int) -> bool:
    """SET key value EX ttl_s unless the user was erased, or their caches purged, after `started_at`; True
    when written."""
    marks = (keys.erasure_key(tag), key, keys.cache_purged_key(tag))
    return bool(redis.eval(_SET_UNLESS_ERASED, 3, *marks, repr(started_at), value, ttl_s))


def purge_cached_keywords(redis: Any, user_id: str, at: float | None = None) -> int:
    """The user's cached recall keywords and query vectors (derived from queries, they may name what was
    forgotten). First the purge's time (`at`, now by default): a recall that started before it and finishes
    after the scan writes nothing (set_unless_erased)."""
    tag = user_tag(user_id)
    redis.eval(_SET_LATER, 1, keys.cache_purged_key(tag), repr(time.time() if at is None else at), ERASURE_KEY_TTL_S)
    return sum(int(redis.delete(k)) for k in redis.scan_iter(keys.keywords_cache_pattern(tag), count=500))
