"""`/healthz` for anyone, without handing anyone a lever on Redis and Neo4j.

The endpoint needs no token (load balancers), so each request must not cost a round trip to each store: a
flood of anonymous requests would become a flood of pings and Neo4j sessions. One probe runs at a time; its
answer is served to every request for `ttl_s` seconds; while a probe runs, other requests get the last answer
at once instead of queueing behind it (only the very first request waits). So the stores see at most one
probe per `ttl_s` whatever the request rate, and a store going down shows within `ttl_s` plus one probe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CachedHealth:
    def __init__(self, probe: Callable[[], dict[str, bool]], ttl_s: float = 2.0) -> None:
        self._probe = probe
        self._ttl_s = ttl_s
        self._running = threading.Lock()
        self._last: dict[str, bool] | None = None
        self._taken_at = 0.0

    def __call__(self) -> dict[str, bool]:
        last = self._last
        if last is not None and time.monotonic() - self._taken_at < self._ttl_s:
            return dict(last)
        if last is not None and not self._running.acquire(blocking=False):
            return dict(last)  # a probe is running: its predecessor's answer, not a second probe
        if last is None:
            self._running.acquire()  # the very first request waits for the first probe
        try:
            if self._last is not None and time.monotonic() - self._taken_at < self._ttl_s:
                return dict(self._last)  # another thread probed while this one waited for the lock
            answer = self._probe()
            self._last, self._taken_at = dict(answer), time.monotonic()
            return answer
        finally:
            self._running.release()
