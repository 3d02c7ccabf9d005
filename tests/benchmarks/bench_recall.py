"""Recall benchmark: MemoryClient.retrieve_memory (local keywords) at 10k and 100k episodes against the bare
fulltext query as the floor, and recall@k on the relevance set of the tests. The floor is recall's main list
alone: the same Lucene query over the search windows, the same k (Neo4jGraphStore.run_bare_fulltext).

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_recall)

Targets (issue 5): p95 ≤ 3× the floor's p95; p95 at 100k ≤ 1.5× p95 at 10k; recall@5 reported (the test
suite holds a floor for it). The load is the one of bench_store (1k users `bench-u####`, cleared first);
each p95 is the median over ROUNDS rounds, recall and floor interleaved query by query.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from api_stub.client import MemoryClient
from tests.benchmarks.bench_store import ROUNDS, USERS, WARMUP, clear_population, load, queries
from tests.benchmarks.common import Corpus, measure_rounds, summarise_rounds, timed, write_results
from tests.relevance import load_dataset, recall_at_k, store_dataset
from tests.services import load_services_env
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keywords import local_keywords
from worker.settings import Settings

QUERIES = 200  # per round


def bench_latency(client: MemoryClient, store: Neo4jGraphStore, corpus: Corpus, total: int) -> dict[str, Any]:
    load(store, corpus, total)
    max_keywords = client.settings.max_keywords
    asked = [(user, text) for user, _, text in queries(corpus, total // USERS)]
    for user_id, text in asked[:WARMUP]:
        client.retrieve_memory(user_id, text)
    degraded = 0

    def measure(item: tuple[str, str]) -> tuple[float, float]:
        nonlocal degraded
        user_id, text = item
        keywords = local_keywords(text, max_keywords)
        started = time.perf_counter()
        degraded += client.retrieve_memory(user_id, text).degraded
        recalled = time.perf_counter() - started
        return recalled, timed(lambda: store.run_bare_fulltext(user_id, keywords, text))

    rounds = measure_rounds(asked[WARMUP:], ROUNDS, QUERIES, measure)
    return {
        "episodes": total,
        "users": USERS,
        "queries_per_round": QUERIES,
        **summarise_rounds("retrieve", rounds),
        "degraded_answers": degraded,
    }


def relevance(client: MemoryClient, store: Neo4jGraphStore, settings: Settings) -> dict[str, Any]:
    data = load_dataset()
    prefix = f"bench-rel-{uuid.uuid4().hex[:6]}"
    keys = store_dataset(data, prefix, store, settings)
    try:
        at5, missed = recall_at_k(data, prefix, keys, client.retrieve_memory, k=5)
        at1, _ = recall_at_k(data, prefix, keys, client.retrieve_memory, k=1)
    finally:
        for user in data.users:
            store.delete_user(f"{prefix}-{user}")
    return {
        "queries": len(data.queries),
        "episodes": len(data.episodes),
        "recall_at_5": round(at5, 3),
        "recall_at_1": round(at1, 3),
        "missed_at_5": missed,
    }


def main() -> None:
    load_services_env()
    settings = Settings.load()
    store = Neo4jGraphStore.from_settings(settings)
    store.ensure_schema()
    client = MemoryClient(settings)
    corpus = Corpus()
    results: dict[str, Any] = {"relevance": relevance(client, store, settings)}
    clear_population(store)
    at_10k = bench_latency(client, store, corpus, 10_000)
    at_100k = bench_latency(client, store, corpus, 100_000)
    results["retrieve_10k"], results["retrieve_100k"] = at_10k, at_100k
    results["p95_100k_over_10k"] = round(at_100k["retrieve_p95_ms_median"] / at_10k["retrieve_p95_ms_median"], 2)
    results["targets"] = {"p95_ratio_to_floor_max": 3.0, "p95_100k_over_10k_max": 1.5}
    write_results("bench_recall", results)
    client.close()
    store.close()


if __name__ == "__main__":
    main()
