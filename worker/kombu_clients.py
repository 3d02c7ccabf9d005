"""One redis client per kombu channel instead of one per command.

kombu's Redis transport builds a new `redis.Redis` object for every publish, acknowledgement and event
(`Channel._create_client`); with redis-py 8 building one copies its whole table of response callbacks, about
a tenth of a busy worker's CPU (measured with py-spy on the write path). A `redis.Redis` object is
thread-safe (each command takes a connection from the pool; pipelines are made per call), so the channel
keeps one for its current pool and hands it out again.
"""

from __future__ import annotations

from typing import Any

_CACHE = "_memory_sync_client"


def reuse_redis_clients() -> None:
    """Idempotent; called when the Celery app is configured, before its first connection."""
    from kombu.transport import redis as transport

    original: Any = transport.Channel._create_client
    if getattr(original, "_memory_reuses", False):
        return

    def create_client(self: Any, asynchronous: bool = False) -> Any:
        if asynchronous:  # the BRPOP / pub-sub clients: kombu keeps those itself
            return original(self, asynchronous=True)
        client = self.__dict__.get(_CACHE)
        if client is None or client.connection_pool is not self.pool:  # a reconnected channel gets a new pool
            client = self.__dict__[_CACHE] = original(self)
        return client

    create_client._memory_reuses = True  # type: ignore[attr-defined]
    transport.Channel._create_client = create_client  # type: ignore[method-assign]
