"""Counters of the write path kept in Redis, so that every worker process adds to the same totals and a
restart loses nothing. The metrics endpoint reads them; a failure to count never fails a write."""

from __future__ import annotations

import logging
from typing import Any

from worker.keys import STATS

log = logging.getLogger("memory.stats")

# field in the Redis hash → meaning; the metrics collector exports each of them
EPISODES_PERSISTED = "episodes_persisted"  # newly stored episodes (a redelivered save is not counted twice)
EXTRACTIONS = "extractions:"  # + kind: llm, offline, degraded
LLM_CALLS = "llm_calls"
LLM_PROMPT_TOKENS = "llm_prompt_tokens"
LLM_COMPLETION_TOKENS = "llm_completion_tokens"
LLM_COST_USD = "llm_cost_usd"
DROPPED = "dropped:"  # + entity or relationship: items of LLM answers left out by validation
PERSIST_TRANSACTIONS = "persist_transactions"  # persist transactions committed (each holds one or more episodes)
PERSIST_TRANSACTION_EPISODES = "persist_transaction_episodes"  # the episodes those transactions held


def extraction_counts(record: dict[str, Any]) -> tuple[dict[str, int], float]:
    """The counts of one finished extraction (counted where the LLM was paid for, so retried persists cost
    nothing), and its cost in USD."""
    counts = {
        EXTRACTIONS + str(record.get("extraction", "unknown")): 1,
        LLM_CALLS: int(record.get("llm_calls") or 0),
        LLM_PROMPT_TOKENS: int(record.get("prompt_tokens") or 0),
        LLM_COMPLETION_TOKENS: int(record.get("completion_tokens") or 0),
        DROPPED + "entity": int(record.get("dropped_entities") or 0),
        DROPPED + "relationship": int(record.get("dropped_relationships") or 0),
    }
    return counts, float(record.get("cost_usd") or 0.0)


def queue_counts(pipe: Any, counts: dict[str, int], cost_usd: float = 0.0) -> int:
    """Queue the increments on a pipeline (its caller executes it); how many commands were queued."""
    queued = 0
    for name, n in counts.items():
        if n:
            pipe.hincrby(STATS, name, n)
            queued += 1
    if cost_usd:
        pipe.hincrbyfloat(STATS, LLM_COST_USD, cost_usd)
        queued += 1
    return queued


class Stats:
    def __init__(self, redis: Any) -> None:
        self._redis = redis

    def extracted(self, record: dict[str, Any]) -> None:
        """An extraction finished (see extraction_counts)."""
        counts, cost_usd = extraction_counts(record)
        self.add(counts, cost_usd)

    def llm_used(self, calls: int, prompt_tokens: int, completion_tokens: int, cost_usd: float) -> None:
        """LLM calls outside extraction (recall's keywords)."""
        self.add(
            {LLM_CALLS: calls, LLM_PROMPT_TOKENS: prompt_tokens, LLM_COMPLETION_TOKENS: completion_tokens},
            cost_usd=cost_usd,
        )

    def persisted(self) -> None:
        self.add({EPISODES_PERSISTED: 1})

    def committed(self, episodes: int) -> None:
        """A persist transaction holding `episodes` episodes committed (worker/graph/group_commit.py)."""
        self.add({PERSIST_TRANSACTIONS: 1, PERSIST_TRANSACTION_EPISODES: episodes})

    def add(self, counts: dict[str, int], cost_usd: float = 0.0) -> None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            if queue_counts(pipe, counts, cost_usd):
                pipe.execute()
        except Exception as exc:  # metrics must never fail or retry a write
            log.warning("could not count", extra={"error_class": type(exc).__name__})

    def snapshot(self) -> dict[str, float]:
        raw = self._redis.hgetall(STATS)
        return {_text(k): float(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
