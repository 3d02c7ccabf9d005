"""Prometheus metrics for what Flower does not show: queue depths, dead letters, write-path totals kept in
Redis by the workers, LLM usage and cost, and the recall latency of this process.

Everything is read at scrape time (a custom collector), so nothing runs at import and nothing is cached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from api_stub.recall import RecallCounters
from worker import stats
from worker.deadletter import DeadLetterStore
from worker.keys import INFLIGHT_INDEX, KOMBU_UNACKED, QUEUES, queue_lists


class MemoryCollector(Collector):
    def __init__(self, redis: Callable[[], Any], counters: Callable[[], RecallCounters]) -> None:
        self._redis = redis
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        yield from self._write_path()
        yield from self._recall()

    def _write_path(self) -> Iterator[Metric]:
        redis = self._redis()
        up = GaugeMetricFamily("memory_redis_up", "1 when Redis answered this scrape.")
        try:
            pipe = redis.pipeline(transaction=False)
            for queue in QUEUES:
                for key in queue_lists(queue):
                    pipe.llen(key)
            pipe.hlen(KOMBU_UNACKED)
            pipe.zcard(INFLIGHT_INDEX)
            replies = pipe.execute()
            dead_letters = DeadLetterStore(redis)
            dlq_count, oldest = dead_letters.count(), dead_letters.oldest_age_s()
            totals = stats.Stats(redis).snapshot()
        except Exception:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        depth = GaugeMetricFamily("memory_queue_depth", "Messages waiting in a queue.", labels=["queue"])
        at = 0
        for queue in QUEUES:
            n = len(queue_lists(queue))
            depth.add_metric([queue], sum(replies[at : at + n]))
            at += n
        yield depth
        yield GaugeMetricFamily("memory_unacked_messages", "Messages delivered and not yet acknowledged.", replies[-2])
        yield GaugeMetricFamily("memory_inflight_episodes", "Accepted episodes not yet final.", replies[-1])
        yield GaugeMetricFamily("memory_dead_letters", "Records in the dead-letter store.", dlq_count)
        yield GaugeMetricFamily(
            "memory_dead_letter_oldest_age_seconds", "Age of the oldest dead-letter record (0: none).", oldest or 0.0
        )
        yield CounterMetricFamily(
            "memory_episodes_persisted", "Episodes newly stored in Neo4j.", totals.get(stats.EPISODES_PERSISTED, 0.0)
        )
        yield CounterMetricFamily(
            "memory_persist_transactions",
            "Persist transactions committed.",
            totals.get(stats.PERSIST_TRANSACTIONS, 0.0),
        )
        yield CounterMetricFamily(
            "memory_persist_transaction_episodes",
            "Episodes handed to those transactions, written or not (divided by them: episodes per transaction).",
            totals.get(stats.PERSIST_TRANSACTION_EPISODES, 0.0),
        )
        kinds = CounterMetricFamily("memory_extractions", "Finished extractions by kind.", labels=["kind"])
        for kind in ("llm", "offline", "degraded"):
            kinds.add_metric([kind], totals.get(stats.EXTRACTIONS + kind, 0.0))
        yield kinds
        yield CounterMetricFamily(
            "memory_extractions_degraded",
            "Extractions kept as raw text because the LLM answer stayed malformed.",
            totals.get(stats.EXTRACTIONS + "degraded", 0.0),
        )
        yield CounterMetricFamily("memory_llm_calls", "LLM calls of extractions.", totals.get(stats.LLM_CALLS, 0.0))
        tokens = CounterMetricFamily("memory_llm_tokens", "LLM tokens used by extractions.", labels=["kind"])
        tokens.add_metric(["prompt"], totals.get(stats.LLM_PROMPT_TOKENS, 0.0))
        tokens.add_metric(["completion"], totals.get(stats.LLM_COMPLETION_TOKENS, 0.0))
        yield tokens
        yield CounterMetricFamily(
            "memory_llm_cost_usd", "LLM cost of extractions as litellm prices it.", totals.get(stats.LLM_COST_USD, 0.0)
        )
        dropped = CounterMetricFamily(
            "memory_llm_items_dropped",
            "Entities and relationships of LLM answers left out because they did not validate.",
            labels=["kind"],
        )
        for kind in ("entity", "relationship"):
            dropped.add_metric([kind], totals.get(stats.DROPPED + kind, 0.0))
        yield dropped

    def _recall(self) -> Iterator[Metric]:
        counters = self._counters()
        latency = HistogramMetricFamily("memory_recall_latency_seconds", "retrieve_memory latency in this process.")
        latency.add_metric([], counters.cumulative_buckets(), counters.latency_sum_s)
        yield latency
        yield CounterMetricFamily("memory_recall_degraded", "Recalls answered degraded.", counters.degraded)
        yield CounterMetricFamily(
            "memory_recall_foreign_results_dropped",
            "Results of another user dropped by the final check (should stay 0; alert otherwise).",
            counters.foreign_results_dropped,
        )


def registry(redis: Callable[[], Any], counters: Callable[[], RecallCounters]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(MemoryCollector(redis, counters))
    return reg
