"""The writes that end a stage task (tasks/end.py), sent in one round trip after the stage: a refused count
fails nothing, and an end that cannot be written after the episode's write committed never retries or
dead-letters that stage (real worker, real Redis errors)."""

from __future__ import annotations

from collections.abc import Callable

from api_stub.client import MemoryClient
from tests.ingest_helpers import wait_until
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker import keys
from worker.celery_app import persist_task_id
from worker.deadletter import DeadLetterStore
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.inflight import InFlight
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
