"""What the sweeps give back, and what they must not (issue 33 items 6-8): an episode whose in-flight record
was left open after it persisted is closed and still reported persisted; a message lost from the broker is
found again while the broker is busy; two liveness sweeps at once never hand one message out twice."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from api_stub.client import EpisodeReceipt, MemoryClient
from tests.ingest_helpers import episodes_for, graph_facts, wait_until
from tests.llm_standin import Reply, StandIn, answer
from tests.services import RedisClient
from tests.test_policy_and_dlq import memctl
from tests.workers import WorkerProcess
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.inflight import InFlight

Workers = Callable[..., WorkerProcess]


def persisted_once(
    redis: RedisClient, workers: Workers, client: MemoryClient, user: str, seed: int
) -> tuple[list[EpisodeReceipt], dict[str, Any]]:
    """One episode sent and persisted by a worker: its receipt, and the in-flight payload it was accepted with."""
    items, _ = episodes_for([user], 1, seed=seed)
    receipts = client.add_episodes(items)
    payload = InFlight(redis).payload(receipts[0].episode_id)
    assert payload is not None
    workers()
    assert [s.state for s in client.wait(receipts, 60)] == ["persisted"]
    return receipts, payload


def test_a_persisted_episode_whose_record_was_left_open_is_closed_and_still_reported_persisted(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    """Item 7: the record could not be marked done (a Redis blip after the commit); the sweep finds it silent
    with the broker idle. The send is final: its outcome stays `persisted`, nothing is extracted again."""
    user = new_user("left-open")
    receipts, payload = persisted_once(clean_redis, workers, client, user, seed=11)
    in_flight = InFlight(clean_redis)
    in_flight.add(receipts[0].episode_id, user, payload, at=time.time() - 3600)  # left open, long silent
    memctl("sweep")
    wait_until(lambda: in_flight.count() == 0, 60, "the record to be closed")
    time.sleep(1.0)  # a re-published send would be done by now
    assert [s.state for s in client.wait(receipts, 10)] == ["persisted"]
    assert graph_facts(store, user)["episodes"] == 1


def test_a_left_open_send_whose_outcome_expired_is_sent_again_and_reported_persisted(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    """Item 7, when the outcome is gone too (expired, or its write failed): the sweep sends the send again, and
    finding this very send stored it reports persisted, not unchanged."""
    from worker.celery_app import persist_task_id

    user = new_user("left-open-expired")
    receipts, payload = persisted_once(clean_redis, workers, client, user, seed=12)
    in_flight = InFlight(clean_redis)
    client._celery().backend.forget(persist_task_id(receipts[0].episode_id))
    in_flight.add(receipts[0].episode_id, user, payload, at=time.time() - 3600)
    assert memctl("sweep").stdout.strip() == "re-enqueued 1"
    assert [s.state for s in client.wait(receipts, 60)] == ["persisted"]
    wait_until(lambda: in_flight.count() == 0, 30, "the record to be closed")
    assert graph_facts(store, user)["episodes"] == 1


def test_a_stage_running_longer_than_the_visibility_timeout_calls_the_model_once(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    standin: StandIn,
    new_user: Callable[[str], str],
) -> None:
    """Item 11 (paid twice under load): an attempt that outlives the broker's visibility timeout (a slow model, a
    busy machine, a store coming back) was handed by kombu to a second thread while the first still ran, and
    both asked the model. A live worker's heartbeat keeps what it holds from being handed out again."""
    from tests.test_ingest_faults import GOOD, extraction_calls, stand_in_env

    standin.default = lambda _request: Reply(content=answer(GOOD).content, delay_s=20.0)  # visibility: 15 s
    user = new_user("slow-model")
    items, _ = episodes_for([user], 2, seed=13)
    workers(**stand_in_env(standin), MEMORY_LLM_TIMEOUT_S="60")
    receipts = client.add_episodes(items)
    assert [s.state for s in client.wait(receipts, 90)] == ["persisted"] * 2
    time.sleep(3.0)  # a second run, if one was started, has asked by now
    assert sorted(extraction_calls(standin).values()) == [1, 1]
    assert graph_facts(store, user)["episodes"] == 2


def test_a_message_lost_from_a_busy_broker_is_found_again_at_the_second_sweep(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    """Item 6: the broker is never idle under steady traffic, so the sweep never fired and a lost message
    stayed lost. Now a silent episode no queued or unacknowledged message carries is a suspect, and re-enqueued
    when the next sweep still finds it silent and carried by none; the queued ones, as old, are left alone."""
    from worker.keys import EXTRACT_QUEUE, INFLIGHT_INDEX

    user = new_user("lost-busy")
    items, _ = episodes_for([user], 4, seed=14)
    receipts = client.add_episodes(items)
    assert clean_redis.rpop(EXTRACT_QUEUE) is not None  # the oldest, lost as after a BRPOP
    for receipt in receipts:  # every one silent for long: the three queued must not be taken for lost
        clean_redis.zadd(INFLIGHT_INDEX, {receipt.episode_id: time.time() - 3600})
    assert memctl("sweep").stdout.strip() == "re-enqueued 0"  # the broker is busy: a suspect, not yet lost
    assert clean_redis.llen(EXTRACT_QUEUE) == 3
    assert memctl("sweep").stdout.strip() == "re-enqueued 1"
    assert clean_redis.llen(EXTRACT_QUEUE) == 4
    workers()
    assert [s.state for s in client.wait(receipts, 60)] == ["persisted"] * 4
    assert graph_facts(store, user)["episodes"] == 4
    wait_until(lambda: InFlight(clean_redis).count() == 0, 30, "the records to be closed")
