"""MemoryClient.close() releases the connections the client opened, whichever threads used it."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path
from urllib.parse import urlparse

from api_stub.client import MemoryClient
from tests.services import RedisClient
from worker.settings import Settings

MESSAGES = [{"role": "user", "content": "I moved to Lisbon last spring."}]


def _sockets_to(port: int) -> set[str]:
    """The inodes of this process's established TCP connections to `port` (from /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01" and fields[9] in inodes:
                found.add(fields[9])
    return found


def _use(client: MemoryClient, user_id: str, session_id: str) -> None:
    receipt = client.add_episode(user_id, session_id, MESSAGES)
    client.wait([receipt], timeout_s=0)  # no worker runs: pending, but the result backend was read
    # a persist task sent alone (a dead letter's replay): Celery subscribes to its result (pub/sub)
    client.republish({"episode_id": f"close-{session_id}", "user_id": user_id, "status": "unchanged"})


def test_close_releases_the_clients_redis_connections(settings: Settings, clean_redis: RedisClient) -> None:
    port = urlparse(settings.redis_url).port or 6379
    first = MemoryClient(settings)
    _use(first, "close-u", "s0")
    first.close()
    gc.collect()  # what earlier code left for the garbage collector closes its sockets now, not mid-test
    # kombu keeps one producer pool per broker URL for the whole process, shared by every client: open now
    before = _sockets_to(port)
    # Nothing is left to the garbage collector either: it would close what the client forgot, hiding it.
    gc.disable()
    release, used = threading.Event(), threading.Semaphore(0)

    def use_and_stay(session_id: str) -> None:  # a thread still alive when the client is closed
        try:
            _use(client, "close-u", session_id)
        finally:
            used.release()
        release.wait(30)

    client = MemoryClient(settings)
    threads = [threading.Thread(target=use_and_stay, args=(f"t{i}",)) for i in range(3)]
    try:
        _use(client, "close-u", "s1")
        for thread in threads:  # one at a time (concurrent publishes would grow kombu's shared pool)
            thread.start()
            assert used.acquire(timeout=30)
        assert _sockets_to(port) - before  # the client holds connections of its own while open
        client.close()
        assert not _sockets_to(port) - before  # none of them outlives close()
    finally:
        release.set()
        for thread in threads:
            thread.join()
        gc.enable()

    _use(client, "close-u", "s2")  # usable again after close: it opens what it needs anew
    client.close()
    assert not _sockets_to(port) - before
