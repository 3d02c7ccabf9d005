"""A token bucket in Redis shared by every worker process, so that many workers cannot cause a 429 storm."""

from __future__ import annotations

import time

from redis import Redis

from worker.errors import LLMError

# KEYS[1] bucket; ARGV: rate (tokens/s), capacity. Redis's own clock, so every process agrees on time.
# Returns 0 when a token was taken, else the milliseconds until one will be there.
_TAKE = """
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + (now - at) * rate / 1000)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity * 1000 / rate) + 1000)
return wait
"""


class RedisTokenBucket:
    """requests_per_minute spread evenly; bursts of at most one second's worth (at least one call)."""

    def __init__(self, redis: Redis[bytes], key: str, requests_per_minute: int, max_wait_s: float) -> None:
        self._redis = redis
        self._key = key
        self._rate = requests_per_minute / 60.0
        self._capacity = max(1.0, self._rate)
        self._max_wait_s = max_wait_s
        self._script = redis.register_script(_TAKE)

    def acquire(self) -> None:
        """Block until a call may be made; past max_wait_s raise a transient LLMError (retry later)."""
        deadline = time.monotonic() + self._max_wait_s
        while True:
            wait_ms = int(self._script(keys=[self._key], args=[self._rate, self._capacity]))
            if wait_ms <= 0:
                return
            if time.monotonic() + wait_ms / 1000 > deadline:
                raise LLMError(
                    "LLM rate limit: no slot within the wait limit",
                    transient=True,
                    cause="LocalRateLimit",
                    retry_after_s=wait_ms / 1000,
                )
            time.sleep(wait_ms / 1000)
