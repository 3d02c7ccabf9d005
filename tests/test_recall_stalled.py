"""A stalled store or cache (the process frozen with SIGSTOP: sockets open, nothing answers) cannot hold the
caller's turn: recall answers degraded within its budget plus a small margin, and strict raises as fast."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from api_stub.client import MemoryClient
from tests.factories import entities, record
from tests.services import local_pid
from worker.errors import StoreUnavailable
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.settings import Settings

MARGIN_S = 0.3  # thread hand-off and the test's own clock reading; the code's own margin is 50 ms


@contextmanager
def frozen(pidfile: str, pattern: str) -> Iterator[None]:
    pid = local_pid(pidfile, pattern)
    assert pid is not None, f"no running local service recorded in {pidfile}"
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def timed(call: Callable[[], object]) -> tuple[object, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_a_stalled_neo4j_gives_a_degraded_answer_within_the_budget(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("stalled-neo4j")
    store.save_episode(record(user, "my sister Anna lives in Lisbon"), entities("Anna"), [])
    client = MemoryClient(settings)
    try:
        assert not client.retrieve_memory(user, "Lisbon", budget_ms=20_000).degraded  # connections made
        with frozen("neo4j/launcher.pid", "memory.Neo4jLauncher"):
            context, took = timed(lambda: client.retrieve_memory(user, "Lisbon", budget_ms=500))
            assert took < 0.5 + MARGIN_S, took
            assert context.degraded and context.related_episodes == []  # type: ignore[attr-defined]
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                client.retrieve_memory(user, "Lisbon", budget_ms=500, strict=True)
            assert time.monotonic() - started < 0.5 + MARGIN_S
        deadline = time.monotonic() + 30  # resumed: answers again
        while client.retrieve_memory(user, "Lisbon", budget_ms=5_000).degraded:
            assert time.monotonic() < deadline, "recall did not come back after Neo4j resumed"
            time.sleep(0.5)
    finally:
        client.close()


def test_a_stalled_redis_gives_a_degraded_answer_within_the_budget(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    """Recall reads Redis for cached query embeddings (and LLM keywords); an embedding model is configured
    here (at an address nothing listens on: the cache read comes first and is what stalls)."""
    user = new_user("stalled-redis")
    store.save_episode(record(user, "my sister Anna lives in Lisbon"), entities("Anna"), [])
    with_model = settings.model_copy(
        update={"embedding_model": "openai/e5-passage", "embedding_api_base": "http://127.0.0.1:9/v1"}
    )
    client = MemoryClient(with_model)
    try:
        client.retrieve_memory(user, "Lisbon", budget_ms=2_000)  # connections made
        with frozen("redis/redis.pid", "redis-server"):
            context, took = timed(lambda: client.retrieve_memory(user, "Lisbon", budget_ms=500))
            assert took < 0.5 + MARGIN_S, took
            assert context.degraded  # type: ignore[attr-defined]
    finally:
        client.close()


def test_recalls_beyond_the_concurrency_wait_for_a_slot_and_stuck_ones_cannot_starve_the_rest_forever(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("recall-slots")
    store.save_episode(record(user, "my sister Anna lives in Lisbon"), entities("Anna"), [])
    client = MemoryClient(settings.model_copy(update={"recall_concurrency": 2}))
    try:
        assert not client.retrieve_memory(user, "Lisbon", budget_ms=20_000).degraded  # connections made
        # Healthy stores: eight callers at once on two slots all get a real answer (they queue, within budget).
        with ThreadPoolExecutor(max_workers=8) as callers:
            answers = list(callers.map(lambda _: client.retrieve_memory(user, "Lisbon", budget_ms=10_000), range(8)))
        assert [a.degraded for a in answers] == [False] * 8
        assert all(a.related_episodes for a in answers)
        # Both slots held by recalls stuck on a frozen Neo4j: a third caller answers degraded in its budget.
        with frozen("neo4j/launcher.pid", "memory.Neo4jLauncher"), ThreadPoolExecutor(max_workers=2) as stuck:
            for _ in range(2):
                stuck.submit(client.retrieve_memory, user, "Lisbon", budget_ms=3_000)
            time.sleep(0.3)
            context, took = timed(lambda: client.retrieve_memory(user, "Lisbon", budget_ms=500))
            assert took < 0.5 + MARGIN_S, took
            assert context.degraded and "busy" in (context.reason or "")  # type: ignore[attr-defined]
    finally:
        client.close()


def test_health_says_neo4j_is_down_within_its_timeout_while_neo4j_is_frozen(settings: Settings) -> None:
    """The health check's 2 s was only the server-side timeout of its query: a frozen Neo4j never answers,
    so the ping waited for the driver's read timeout and /healthz kept saying ok for about two minutes."""
    client = MemoryClient(settings)
    try:
        assert client.health(timeout_s=1.0) == {"redis": True, "neo4j": True}  # connections made
        with frozen("neo4j/launcher.pid", "memory.Neo4jLauncher"):
            for _ in range(2):  # and again while the first ping is still stuck
                health, took = timed(lambda: client.health(timeout_s=1.0))
                assert health == {"redis": True, "neo4j": False} and took < 1.0 + MARGIN_S, (health, took)
        deadline = time.monotonic() + 30  # resumed: up again
        while not client.health(timeout_s=1.0)["neo4j"]:
            assert time.monotonic() < deadline, "health did not come back after Neo4j resumed"
    finally:
        client.close()
