"""Faults on the write path, with real processes: killed workers, Neo4j and Redis outages, poison messages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from api_stub.cli_dlq import enqueue_letter
from api_stub.client import MemoryClient
from tests.ingest_helpers import episodes_for, graph_facts, wait_until
from tests.llm_standin import Reply, StandIn, answer
from tests.services import ROOT, RedisClient, services
from tests.workers import WorkerProcess, celery_pids
from worker.deadletter import DeadLetterStore
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keys import EXTRACT_QUEUE, PERSIST_QUEUE

Workers = Callable[..., WorkerProcess]
GOOD = {"summary": "met people", "entities": [{"name": "Anna", "type": "person"}, {"name": "Lisbon"}]}


def stand_in_env(standin: StandIn) -> dict[str, str]:
    return {"MEMORY_LLM_MODEL": "openai/stand-in", "MEMORY_LLM_API_BASE": standin.url, "MEMORY_LLM_API_KEY": "sk-x"}


def extraction_calls(standin: StandIn) -> dict[str, int]:
    """LLM calls per conversation text seen by the stand-in (one key per episode)."""
    seen: dict[str, int] = {}
    for request in standin.requests:
        text = request["messages"][-1]["content"]
        seen[text] = seen.get(text, 0) + 1
    return seen


def test_sigkilled_worker_group_then_new_worker_persists_everything_once(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    standin: StandIn,
    new_user: Callable[[str], str],
) -> None:
    standin.default = lambda _request: Reply(content=json.dumps(GOOD), delay_s=0.05)
    users = [new_user(f"k{i}") for i in range(4)]
    items, _ = episodes_for(users, 25, seed=3)
    first = workers(**stand_in_env(standin))
    receipts = client.add_episodes(items)
    wait_until(lambda: standin.calls >= 30, 60, "some extractions")
    first.kill()
    assert clean_redis.llen(EXTRACT_QUEUE) + clean_redis.hlen("unacked") > 0  # work was left in flight
    workers(**stand_in_env(standin))
    states = client.wait(receipts, timeout_s=180)
    assert {s.state for s in states} == {"persisted"}
    for user in users:
        facts = graph_facts(store, user)
        assert facts["episodes"] == 25
        assert sorted(facts["names"]) == ["Anna", "Lisbon"]
        assert facts["mentions"] == facts["pairs"] == facts["counters"] == 50


@pytest.mark.usefixtures("neo4j_restorer")
def test_an_inline_write_that_fails_goes_to_the_persist_queue_without_asking_the_model_again(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    standin: StandIn,
    new_user: Callable[[str], str],
) -> None:
    """Neo4j goes away while the model answers: the extract task cannot write what it extracted, so its
    chain takes the extraction to the persist task, which retries until Neo4j is back."""
    gate = threading.Event()

    def reply(_request: dict[str, Any]) -> Reply:
        gate.wait(60)
        return answer(GOOD)

    standin.default = reply
    user = new_user("handover")
    items, _ = episodes_for([user], 5, seed=7)
    env = {**stand_in_env(standin), "MEMORY_RETRY_MAX_ATTEMPTS": "60", "MEMORY_NEO4J_RETRY_TIME_S": "0"}
    worker = workers(**env)
    receipts = client.add_episodes(items)
    wait_until(lambda: standin.calls == 5, 60, "every extraction waiting on the model")
    services("down", "neo4j")
    gate.set()
    wait_until(lambda: worker.log_path.read_text().count("inline persist failed") == 5, 60, "inline writes failing")
    failed = [line for line in worker.log_path.read_text().splitlines() if "inline persist failed" in line]
    assert f'"episode_id": "{receipts[0].episode_id}"' in "\n".join(failed)  # each line says which episode
    services("up", "neo4j")
    states = client.wait(receipts, timeout_s=120)
    assert {s.state for s in states} == {"persisted"}
    assert sorted(extraction_calls(standin).values()) == [1] * 5  # the persist task never asked the model
    facts = graph_facts(store, user)
    assert facts["episodes"] == 5 and facts["mentions"] == 10
    assert DeadLetterStore(clean_redis).list() == []


@pytest.mark.usefixtures("neo4j_restorer")
def test_neo4j_outage_retries_only_persist(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    standin: StandIn,
    new_user: Callable[[str], str],
) -> None:
    standin.default = lambda _request: answer(GOOD)
    user = new_user("outage")
    items, _ = episodes_for([user], 20, seed=4)
    workers("--queues", EXTRACT_QUEUE, MEMORY_PERSIST_INLINE="false", **stand_in_env(standin))
    receipts = client.add_episodes(items)
    wait_until(lambda: clean_redis.llen(PERSIST_QUEUE) == 20, 60, "all extractions")
    services("down", "neo4j")
    # Retries must outlast a Neo4j restart on a loaded 2-core machine (can take over 30 s): about 2 minutes.
    workers("--queues", PERSIST_QUEUE, MEMORY_RETRY_MAX_ATTEMPTS="60", **stand_in_env(standin))
    time.sleep(4)  # persist attempts fail and back off meanwhile
    services("up", "neo4j")
    states = client.wait(receipts, timeout_s=120)
    assert {s.state for s in states} == {"persisted"}
    assert graph_facts(store, user)["episodes"] == 20
    assert sorted(extraction_calls(standin).values()) == [1] * 20  # the LLM was billed once per episode


@pytest.mark.usefixtures("neo4j_restorer")
def test_outage_longer_than_the_retry_budget_dead_letters_then_replay_persists_all(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    standin: StandIn,
    new_user: Callable[[str], str],
) -> None:
    standin.default = lambda _request: answer(GOOD)
    user = new_user("dlq")
    items, _ = episodes_for([user], 12, seed=5)
    services("down", "neo4j")
    env = {**stand_in_env(standin), "MEMORY_RETRY_MAX_ATTEMPTS": "2", "MEMORY_RETRY_BACKOFF_BASE_S": "0.2"}
    workers(**env)
    receipts = client.add_episodes(items)
    states = client.wait(receipts, timeout_s=120)
    assert {s.state for s in states} == {"dead_lettered"}
    letters = DeadLetterStore(clean_redis).list()
    assert len(letters) == 12
    # With Neo4j down, the extract stage could not read the session's progress: it is the stage that failed,
    # before any LLM call. Its record carries the whole conversation for a replay.
    for letter in letters:
        assert letter.user_id == user and letter.error_class == "StoreUnavailable" and letter.attempts == 3
        assert letter.payload["episode"]["messages"] and letter.traceback
    assert standin.calls == 0

    services("up", "neo4j")
    out = subprocess.run(
        [sys.executable, "-m", "api_stub.cli", "dlq", "replay", "--all"],
        cwd=ROOT,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "replayed 12" in out.stdout
    wait_until(lambda: graph_facts(store, user)["episodes"] == 12, 120, "replayed episodes persisted")
    assert DeadLetterStore(clean_redis).count() == 0
    assert sorted(extraction_calls(standin).values()) == [1] * 12


@pytest.mark.usefixtures("neo4j_restorer")
def test_persist_stage_dead_letter_keeps_the_extraction_and_replay_skips_the_llm(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    standin: StandIn,
    new_user: Callable[[str], str],
) -> None:
    standin.default = lambda _request: answer(GOOD)
    user = new_user("pdlq")
    items, _ = episodes_for([user], 5, seed=6)
    workers("--queues", EXTRACT_QUEUE, MEMORY_PERSIST_INLINE="false", **stand_in_env(standin))
    receipts = client.add_episodes(items)
    wait_until(lambda: clean_redis.llen(PERSIST_QUEUE) == 5, 60, "extractions")
    services("down", "neo4j")
    env = {**stand_in_env(standin), "MEMORY_RETRY_MAX_ATTEMPTS": "1", "MEMORY_RETRY_BACKOFF_BASE_S": "0.2"}
    workers("--queues", PERSIST_QUEUE, **env)
    assert {s.state for s in client.wait(receipts, timeout_s=60)} == {"dead_lettered"}
    letters = DeadLetterStore(clean_redis).list()
    assert {letter.stage for letter in letters} == {"persist"}
    assert all(letter.payload["record"]["summary"] == "met people" for letter in letters)
    services("up", "neo4j")
    dead = DeadLetterStore(clean_redis)
    for letter in letters:
        dead.replay(letter.id, lambda rec: enqueue_letter(client, rec))
    wait_until(lambda: graph_facts(store, user)["episodes"] == 5, 60, "replayed persists")
    assert standin.calls == 5  # no new extraction


def test_poison_message_is_dead_lettered_after_bounded_deliveries(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    standin: StandIn,
    new_user: Callable[[str], str],
) -> None:
    """The poison conversation kills the worker that extracts it, on every delivery."""

    def reply(request: dict[str, Any]) -> Reply:
        if "POISON" in request["messages"][-1]["content"]:
            for pid in celery_pids(EXTRACT_QUEUE):
                os.kill(pid, signal.SIGKILL)
            return Reply(status=500, delay_s=1)
        return answer(GOOD)

    standin.default = reply
    user = new_user("poison")
    items, _ = episodes_for([user], 6, seed=7)
    workers("--extract-concurrency", "1", **stand_in_env(standin))
    poison = client.add_episode(user, "bad", [{"role": "user", "content": "this one is POISON for the worker"}])
    receipts = client.add_episodes(items)
    assert {s.state for s in client.wait(receipts, timeout_s=240)} == {"persisted"}
    assert client.wait([poison], timeout_s=240)[0].state == "dead_lettered"
    [letter] = DeadLetterStore(clean_redis).list()
    assert letter.error_class == "DeliveryLimitExceeded" and letter.stage == "extract"
    assert sum(1 for r in standin.requests if "POISON" in r["messages"][-1]["content"]) == 3
    assert graph_facts(store, user)["episodes"] == 6


def test_tasks_queued_across_a_redis_restart_complete(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    user = new_user("aof")
    items, _ = episodes_for([user], 30, seed=8)
    receipts = client.add_episodes(items)
    assert clean_redis.llen(EXTRACT_QUEUE) == 30
    services("down", "redis")
    services("up", "redis")
    workers()
    states = client.wait(receipts, timeout_s=120)
    assert {s.state for s in states} == {"persisted"}
    assert graph_facts(store, user)["episodes"] == 30


def test_a_message_lost_by_the_broker_is_found_again_by_the_sweep(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    standin: StandIn,
    new_user: Callable[[str], str],
) -> None:
    from tests.test_policy_and_dlq import memctl
    from worker.inflight import InFlight
    from worker.keys import INFLIGHT_INDEX

    standin.default = lambda _request: answer(GOOD)
    user = new_user("lost")
    items, _ = episodes_for([user], 3, seed=10)
    receipts = client.add_episodes(items)
    # Lose the oldest message as a worker dying right after its BRPOP would, long enough ago to count.
    assert clean_redis.rpop(EXTRACT_QUEUE) is not None
    clean_redis.zadd(INFLIGHT_INDEX, {receipts[0].episode_id: time.time() - 3600})
    worker = workers(**stand_in_env(standin))
    # Once the queues drain, the worker's periodic sweep finds the silent episode and sends it again.
    wait_until(lambda: graph_facts(store, user)["episodes"] == 3, 90, "the lost episode")
    assert "re-enqueued 1 silent episode" in worker.log_path.read_text()
    wait_until(lambda: InFlight(clean_redis).count() == 0, 30, "the in-flight record to be closed")
    assert memctl("sweep").stdout.strip() == "re-enqueued 0"
    assert [s.state for s in client.wait(receipts, 10)] == ["persisted"] * 3
    assert sorted(extraction_calls(standin).values()) == [1] * 3
