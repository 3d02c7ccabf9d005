"""Every command Redis runs during a block of a test (MONITOR), to count round trips."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tests.services import RedisClient


@contextmanager
def monitored(redis_client: RedisClient) -> Iterator[list[str]]:
    """Every command Redis runs meanwhile (MONITOR), as text; those a Lua script ran start with `[lua] `."""
    seen: list[str] = []
    token = f"monitor-end-{uuid.uuid4().hex}"
    started = threading.Event()

    def listen() -> None:
        with redis_client.monitor() as monitor:
            started.set()
            for command in monitor.listen():
                lua = "[lua] " if command.get("client_type") == "lua" else ""  # run by a script
                seen.append(lua + str(command["command"]))
                if token in seen[-1]:
                    return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert started.wait(10)
    time.sleep(0.2)  # MONITOR is on once its reply came back; the listener's first read follows
    try:
        yield seen
    finally:
        redis_client.echo(token)
        thread.join(10)
