"""A SIGKILLed worker's messages come back within a minute with the default settings, not at the visibility
timeout (an hour): each episode persisted exactly once, and none already persisted sent to the LLM again."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from api_stub.client import MemoryClient
from tests import crash_recovery
from tests.ingest_helpers import graph_facts
from tests.llm_standin import StandIn
from tests.services import RedisClient
from tests.test_sessions import history
from tests.workers import WorkerProcess
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keys import EXTRACT_QUEUE, KOMBU_UNACKED, KOMBU_UNACKED_INDEX


def test_a_killed_workers_messages_are_persisted_once_without_waiting_for_the_visibility_timeout(
    clean_redis: RedisClient,
    client: MemoryClient,
    store: Neo4jGraphStore,
    standin: StandIn,
    new_user: Callable[[str], str],
    tmp_path: Path,
) -> None:
    users = [new_user(f"crash{i}") for i in range(3)]
    # 2 minutes: the recovery takes well under one (the benchmark measures it); before, it took an hour.
    # Each call takes 3 s: extraction (16 threads) still holds messages when the first episodes are persisted.
    outcome = crash_recovery.run(
        client,
        store,
        clean_redis,
        standin,
        users,
        15,
        tmp_path,
        llm_delay_s=3.0,
        persisted_before_kill=3,
        timeout_s=120,
    )
    assert outcome.held_at_kill > 0  # the kill left messages in kombu's unacked hash
    assert outcome.states == {"persisted"}, outcome
    for user in users:
        facts = outcome.facts[user]
        assert facts["episodes"] == 15 and sorted(facts["names"]) == ["Anna", "Lisbon"]
        assert facts["mentions"] == facts["pairs"] == facts["counters"] == 30  # nothing counted twice
    assert outcome.unacked_after == 0  # nothing left to come back at the visibility timeout
    assert outcome.llm_calls_again_for_persisted == 0
    assert outcome.llm_calls_max_per_episode <= 2  # an extraction cut by the kill is asked again, once


def test_a_redelivered_send_that_a_longer_send_covered_meanwhile_says_unchanged(
    clean_redis: RedisClient,
    client: MemoryClient,
    store: Neo4jGraphStore,
    workers: Callable[..., WorkerProcess],
    new_user: Callable[[str], str],
) -> None:
    """Its worker died before it wrote anything, and a longer send of the session was persisted meanwhile:
    delivered again, it finds its messages extracted and stores nothing. It said persisted (any unchanged
    outcome of a redelivered message did), though no episode of its id exists."""
    user = new_user("covered")
    longer = client.add_episode(user, "s", history(5))
    first = workers()
    assert client.wait([longer], 60)[0].state == "persisted"
    first.stop()
    shorter = client.add_episode(user, "s", history(3))
    message = json.loads(clean_redis.rpop(EXTRACT_QUEUE) or "{}")  # received by a worker that then died
    tag, info = message["properties"]["delivery_tag"], message["properties"]["delivery_info"]
    clean_redis.hset(KOMBU_UNACKED, tag, json.dumps([message, info["exchange"], info["routing_key"]]))
    clean_redis.zadd(KOMBU_UNACKED_INDEX, {tag: time.time() - 3600})
    workers()  # it comes back redelivered (kombu's visibility restore, or the sweep: no live worker holds it)
    assert client.wait([shorter], 90)[0].state == "unchanged"
    assert graph_facts(store, user)["episodes"] == 1
