"""The writes that end a stage task (tasks/end.py), sent in one round trip after the stage: a refused count
fails nothing, and an end that cannot be written after the episode's write committed never retries or
dead-letters that stage (real worker, real Redis errors)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from api_stub.client import MemoryClient
from tasks.end import TaskEnd
from tests.ingest_helpers import wait_until
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker import keys
from worker.celery_app import persist_task_id
from worker.deadletter import DeadLetterStore
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.inflight import InFlight
from worker.settings import Settings
from worker.stats import EPISODES_PERSISTED, EXTRACTIONS, Stats

Workers = Callable[..., WorkerProcess]
SAID = [{"role": "user", "content": "I walked with Ada and Bo by the river."}]


def test_a_refused_count_fails_neither_the_write_nor_the_outcome(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    user = new_user("uncounted")
    clean_redis.set(keys.STATS, "not a hash")  # every HINCRBY on it is refused (WRONGTYPE), as under OOM
    receipts = [client.add_episode(user, f"s{i}", SAID) for i in range(3)]
    worker = workers()
    assert [s.state for s in client.wait(receipts, timeout_s=60)] == ["persisted"] * 3
    assert store.stats(user).episodes == 3
    assert InFlight(clean_redis).count() == 0 and not DeadLetterStore(clean_redis).list()
    assert clean_redis.get(keys.STATS) == b"not a hash"
    wait_until(lambda: clean_redis.hlen(keys.KOMBU_UNACKED) == 0, 30, "every message acknowledged")
    log = worker.log_path.read_text(errors="replace")
    assert "could not count" in log and "retrying" not in log and "not written in one round trip" not in log


def test_an_end_that_cannot_be_written_after_the_write_committed_never_retries_the_stage(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    """The outcome's key holds something else (a real Redis error, WRONGTYPE, for the end's one round trip
    and for Celery's own store_result after it): the episode is stored once, its in-flight record is done,
    it is counted once, and the stage is neither retried nor dead-lettered; the other episodes are unharmed."""
    user = new_user("unended")
    broken = f"ep_unended_{user}"
    receipts = [client.add_episode(user, f"s{i}", SAID) for i in range(3)]
    client.add_episode(user, "broken", SAID, episode_id=broken)  # (it clears an earlier send's outcome)
    clean_redis.hset(f"celery-task-meta-{persist_task_id(broken)}", "not", "a result")
    worker = workers()
    assert [s.state for s in client.wait(receipts, timeout_s=60)] == ["persisted"] * 3
    wait_until(lambda: store.stats(user).episodes == 4 and InFlight(clean_redis).count() == 0, 60, "all stored")
    wait_until(lambda: clean_redis.hlen(keys.KOMBU_UNACKED) == 0, 30, "every message acknowledged")
    counts = Stats(clean_redis).snapshot()
    assert counts[EPISODES_PERSISTED] == 4 and counts[EXTRACTIONS + "offline"] == 4  # no second extraction
    assert not DeadLetterStore(clean_redis).list()
    assert clean_redis.hget(f"celery-task-meta-{persist_task_id(broken)}", "not") == b"a result"
    log = worker.log_path.read_text(errors="replace")
    assert "task end not written in one round trip" in log and "retrying" not in log


@contextmanager
def _backend(settings: Settings) -> Iterator[Any]:
    """Celery's result backend as the client configures it; its connections released after."""
    client = MemoryClient(settings)
    try:
        yield client._celery().backend
    finally:
        client.close()


@contextmanager
def _at_maxmemory(redis_client: RedisClient) -> Iterator[None]:
    """Redis full under the services' noeviction policy: every command that may grow memory is refused."""
    before = redis_client.config_get("maxmemory")["maxmemory"]
    redis_client.config_set("maxmemory", 1)
    try:
        yield
    finally:
        redis_client.config_set("maxmemory", before)


def test_a_full_redis_refuses_the_counts_but_the_episode_is_still_marked_done(
    clean_redis: RedisClient, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Under noeviction at maxmemory Redis refuses HINCRBY, and would refuse a whole MULTI holding it; the
    end's commands that free memory (the in-flight record done, the delivery counter deleted) still land."""
    inflight = InFlight(clean_redis)
    inflight.add("ep_full", "u_full", {"episode_id": "ep_full"})
    clean_redis.set("deliveries:full", 1)
    end = TaskEnd("deliveries:full")
    end.persisted()
    end.done("ep_full")
    with (
        _backend(settings) as backend,
        caplog.at_level(logging.WARNING, logger="tasks.end"),
        _at_maxmemory(clean_redis),
    ):
        end.send(clean_redis, inflight, backend, Stats(clean_redis))
    assert inflight.count() == 0 and inflight.payload("ep_full") is None
    assert not clean_redis.exists("deliveries:full")
    assert Stats(clean_redis).snapshot().get(EPISODES_PERSISTED, 0) == 0  # refused, and not retried
    assert "could not count" in caplog.text and "step by step" not in caplog.text


def test_an_outcome_a_full_redis_refuses_fails_the_task_after_the_episode_is_marked_done(
    clean_redis: RedisClient, settings: Settings
) -> None:
    inflight = InFlight(clean_redis)
    inflight.add("ep_full", "u_full", {"episode_id": "ep_full"})
    end = TaskEnd("deliveries:full")
    end.done("ep_full")
    end.store("task-full", {"episode_id": "ep_full", "status": "persisted"})
    with (
        _backend(settings) as backend,
        _at_maxmemory(clean_redis),
        pytest.raises(redis.ResponseError, match="maxmemory"),
    ):
        end.send(clean_redis, inflight, backend, Stats(clean_redis))
    assert inflight.count() == 0  # the episode is stored: the in-flight sweep must not send it again
    assert not clean_redis.exists("celery-task-meta-task-full")


def test_an_outcome_the_round_trip_could_not_store_is_stored_step_by_step(
    clean_redis: RedisClient, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The end's connection may not run scripts (a real NOPERM for its EVAL): Celery's own store_result
    stores the outcome after it, where wait() finds it, and the rest of the end still lands."""
    conn = redis.Redis.from_url(settings.redis_url).connection_pool.connection_kwargs
    clean_redis.acl_setuser(
        "noscripts", enabled=True, passwords=["+noscripts-pw"], keys=["*"], channels=["*"],
        commands=["+@all", "-eval", "-evalsha"],
    )  # fmt: skip
    limited = redis.Redis(host=conn["host"], port=conn["port"], username="noscripts", password="noscripts-pw")
    try:
        inflight = InFlight(limited)
        inflight.add("ep_noperm", "u_noperm", {"episode_id": "ep_noperm"})
        end = TaskEnd("deliveries:noperm")
        end.done("ep_noperm")
        end.persisted()
        end.store("task-noperm", {"episode_id": "ep_noperm", "status": "persisted"})
        with _backend(settings) as backend, caplog.at_level(logging.WARNING, logger="tasks.end"):
            end.send(limited, inflight, backend, Stats(limited))
    finally:
        limited.close()
        clean_redis.acl_deluser("noscripts")
    meta = json.loads(clean_redis.get("celery-task-meta-task-noperm") or b"{}")
    assert meta["status"] == "SUCCESS" and meta["result"] == {"episode_id": "ep_noperm", "status": "persisted"}
    assert InFlight(clean_redis).count() == 0
    assert Stats(clean_redis).snapshot()[EPISODES_PERSISTED] == 1  # counted once: the round trip counted it
    warned = [r for r in caplog.records if "step by step" in r.getMessage()]
    assert [getattr(r, "error_class", None) for r in warned] == ["NoPermissionError"]
