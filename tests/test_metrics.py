"""The Prometheus collector against real Redis: what workers count, the dead-letter store, recall latency."""

from __future__ import annotations

import time

from prometheus_client import generate_latest

from api_stub.metrics import registry
from api_stub.recall import RecallCounters
from tests.services import RedisClient
from worker.deadletter import DeadLetterStore
from worker.keys import EXTRACT_QUEUE, PERSIST_QUEUE, queue_lists
from worker.stats import Stats


def scrape(redis: RedisClient, counters: RecallCounters) -> dict[str, float]:
    text = generate_latest(registry(lambda: redis, lambda: counters)).decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_metrics_report_queues_dead_letters_worker_totals_and_recall_latency(clean_redis: RedisClient) -> None:
    counters = RecallCounters()
    empty = scrape(clean_redis, counters)
    assert empty["memory_redis_up"] == 1
    assert empty['memory_queue_depth{queue="memory.extract"}'] == 0
    assert empty["memory_dead_letters"] == 0 and empty["memory_dead_letter_oldest_age_seconds"] == 0
    assert empty["memory_episodes_persisted_total"] == 0

    clean_redis.lpush(EXTRACT_QUEUE, b"m1", b"m2")
    clean_redis.lpush(queue_lists(EXTRACT_QUEUE)[2], b"m3")  # a message with a priority lives in its own list
    clean_redis.lpush(PERSIST_QUEUE, b"m4")
    stats = Stats(clean_redis)
    stats.extracted(
        {
            "extraction": "llm",
            "llm_calls": 2,
            "prompt_tokens": 900,
            "completion_tokens": 120,
            "cost_usd": 0.0015,
            "dropped_entities": 2,
            "dropped_relationships": 1,
        }
    )
    stats.extracted({"extraction": "degraded", "llm_calls": 2, "prompt_tokens": 800, "completion_tokens": 50})
    stats.persisted()
    stats.persisted()
    stats.committed(2)
    letters = DeadLetterStore(clean_redis)
    letters.add(
        stage="persist",
        task_name="memory.persist_episode",
        task_id="t-1",
        episode_id="ep-1",
        user_id="u-1",
        payload={"episode_id": "ep-1", "user_id": "u-1"},
        error_class="RuntimeError",
        message="boom",
        attempts=3,
    )
    counters.add(degraded=False, dropped=0, latency_s=0.003)
    counters.add(degraded=True, dropped=0, latency_s=0.2)
    time.sleep(1.1)

    got = scrape(clean_redis, counters)
    assert got['memory_queue_depth{queue="memory.extract"}'] == 3
    assert got['memory_queue_depth{queue="memory.persist"}'] == 1
    assert got["memory_episodes_persisted_total"] == 2
    assert got["memory_persist_transactions_total"] == 1
    assert got["memory_persist_transaction_episodes_total"] == 2
    assert got['memory_extractions_total{kind="llm"}'] == 1
    assert got["memory_extractions_degraded_total"] == 1
    assert got["memory_llm_calls_total"] == 4
    assert got['memory_llm_tokens_total{kind="prompt"}'] == 1700
    assert got['memory_llm_tokens_total{kind="completion"}'] == 170
    assert abs(got["memory_llm_cost_usd_total"] - 0.0015) < 1e-9
    assert got['memory_llm_items_dropped_total{kind="entity"}'] == 2
    assert got['memory_llm_items_dropped_total{kind="relationship"}'] == 1
    assert got["memory_dead_letters"] == 1 and got["memory_dead_letter_oldest_age_seconds"] >= 1
    assert got["memory_recall_latency_seconds_count"] == 2
    assert got['memory_recall_latency_seconds_bucket{le="0.005"}'] == 1
    assert got['memory_recall_latency_seconds_bucket{le="0.25"}'] == 2
    assert got["memory_recall_degraded_total"] == 1


def test_metrics_say_redis_is_down_instead_of_failing() -> None:
    import redis

    unreachable = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    got = scrape(unreachable, RecallCounters())
    assert got["memory_redis_up"] == 0
    assert "memory_recall_latency_seconds_count" in got
