"""Recall quality on LoCoMo (Maharana et al., ACL 2024; CC BY-NC 4.0), read from MEMORY_BENCH_LOCOMO_DIR
(default ../shared/datasets/locomo-dev; never copied here): one user per conversation, one episode per
session (its date as occurred_at, `speaker: text` messages), ingested through the real queue and a real
`memctl worker` (offline model), then every question (adversarial ones left out) asked through recall.

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_locomo)

Prints session recall_any@5/@10 overall and per category, an ablation (which signals the fusion uses),
reference rankings computed here on the same data (plain BM25 …), and recall latency; JSON under
tests/benchmarks/results/. Targets (issue 10): @5 ≥ 0.94, @10 ≥ 0.97, full ≥ every ablation.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from redis import Redis

from api_stub.client import MemoryClient
from api_stub.recall import Recall
from tests.benchmarks.bm25 import reference_scores
from tests.benchmarks.common import latency_ms, write_results
from tests.benchmarks.relevance_ablation import relevance_ablation
from tests.locomo import Conversation, dataset_dir, load_conversations, score, session_id
from tests.servers import embedding_env, embedding_server
from tests.services import load_services_env
from tests.workers import WorkerProcess, worker_env
from worker.graph.fusion import FusionWeights
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.identity import user_tag
from worker.keys import keywords_cache_pattern
from worker.keywords import KeywordExtractor
from worker.models import MemoryContext
from worker.query_embedding import QueryEmbedder
from worker.settings import Settings

FULL = FusionWeights()
ABLATION = {
    "windows only": FusionWeights(windows=1.0, episodes=0.0, period=0.0, entities=0.0),
    "text (windows + episodes)": replace(FULL, period=0.0, entities=0.0),
    "text + time": replace(FULL, entities=0.0),
    "text + time + entities (idf 0.1)": replace(FULL, entities=0.1),
    "full (default weights)": FULL,
}
# the defaults in force when a model is configured (MEMORY_RECALL_DENSE_WEIGHT; the entity weight's default)
DENSE = replace(FULL, dense=0.25, entities=0.05)
EMBEDDING_ABLATION = {
    "embeddings only": FusionWeights(windows=0.0, episodes=0.0, period=0.0, entities=0.0, dense=1.0),
    "text + time (no embeddings)": FULL,
    "text + embeddings": replace(DENSE, period=0.0, entities=0.0),
    "text + time + embeddings": replace(DENSE, entities=0.0),
    "text + time + entities 0.05 + embeddings (default with a model)": DENSE,
}


def ingest(client: MemoryClient, conversations: Sequence[Conversation], user_of: dict[str, str]) -> float:
    """Every session through add_episode and a real worker; returns the seconds until all are persisted."""
    started = time.perf_counter()
    receipts = [
        client.add_episode(user_of[c.name], session_id(s.number), s.messages, occurred_at=s.occurred_at)
        for c in conversations
        for s in c.sessions
    ]
    states = client.wait(receipts, timeout_s=1800)  # embeddings on 2 shared cores take minutes
    failed = [s for s in states if s.state != "persisted"]
    if failed:
        raise RuntimeError(f"{len(failed)} sessions were not persisted: {failed[:3]}")
    return time.perf_counter() - started


def run(
    conversations: Sequence[Conversation],
    settings: Settings,
    weights: dict[str, FusionWeights],
    embeddings: bool = False,
) -> dict[str, Any]:
    """Ingest with a fresh worker (and, with embeddings, a local e5 server), score each weighting, clean up.
    Used by the bench and by the tests."""
    prefix = f"locomo-{uuid.uuid4().hex[:6]}"
    user_of = {c.name: f"{prefix}-{c.name}" for c in conversations}
    logs = Path(tempfile.mkdtemp())
    server = embedding_server(logs / "e5.log").start() if embeddings else None
    env = embedding_env(server) if server else {}
    if server:
        update: dict[str, Any] = {k.removeprefix("MEMORY_").lower(): v for k, v in env.items()}
        update["embedding_api_key"] = SecretStr(update["embedding_api_key"])
        update["embedding_budget_ms"] = 20_000  # measure ranking, not whether a cold query beat 300 ms
        settings = settings.model_copy(update=update)
    client = MemoryClient(settings)
    store = Neo4jGraphStore.from_settings(settings)
    store.ensure_schema()
    redis = Redis.from_url(settings.redis_url)  # query embeddings cached: each weighting asks the same questions
    recall = Recall(settings, store, KeywordExtractor(settings), QueryEmbedder(settings, redis=redis))
    # One local model on 2 cores answers one request at a time: two extract threads keep it busy without
    # piling up requests that time out (production sizes this with MEMORY_EMBEDDING_TIMEOUT_S and threads).
    worker_args = ("--extract-concurrency", "2") if server else ()
    worker = WorkerProcess(
        logs / "worker.log",
        worker_env(MEMORY_LLM_MODEL="offline", MEMORY_EMBEDDING_TIMEOUT_S="300", **env),
        *worker_args,
    ).start()
    try:
        ingest_s = ingest(client, conversations, user_of)
        latencies: list[float] = []

        def retrieve(user: str, text: str, limit: int) -> MemoryContext:
            started = time.perf_counter()
            context = recall.retrieve(user, text, limit=limit, budget_ms=10_000)
            latencies.append(time.perf_counter() - started)
            if context.degraded:
                raise RuntimeError(f"degraded recall: {context.reason}")
            return context

        results: dict[str, Any] = {"ingest_s": round(ingest_s, 1)}
        for name, w in weights.items():
            store.weights = w
            latencies.clear()
            results[name] = score(conversations, lambda c: user_of[c.name], retrieve).summary()
            results[name]["latency"] = latency_ms(latencies)
        store.weights = DENSE if embeddings else FULL
        results["limit_5_equals_first_5_of_limit_10"] = same_first_five(recall, conversations, user_of)
    finally:
        worker.stop()
        if server:
            server.stop()
        for user in user_of.values():
            store.delete_user(user)
            for key in redis.scan_iter(keywords_cache_pattern(user_tag(user))):
                redis.delete(key)
        recall.close()
        client.close()
    return results


def _at_least_every(results: dict[str, Any], full: str, names: dict[str, FusionWeights]) -> bool:
    return all(results[full]["recall_any@5"] >= results[k]["recall_any@5"] for k in names)


def same_first_five(recall: Recall, conversations: Sequence[Conversation], user_of: dict[str, str]) -> bool:
    for c in conversations:
        for q in c.questions:
            five = [h.id for h in recall.retrieve(user_of[c.name], q.text, limit=5).related_episodes]
            ten = [h.id for h in recall.retrieve(user_of[c.name], q.text, limit=10).related_episodes]
            if five != ten[:5]:
                return False
    return True


def main() -> None:
    directory = dataset_dir()
    try:
        conversations = load_conversations(directory)
    except FileNotFoundError as exc:
        print(f"bench_locomo: {exc}; set MEMORY_BENCH_LOCOMO_DIR to a LoCoMo-format directory", file=sys.stderr)
        sys.exit(2)
    load_services_env()
    settings = Settings.load()
    results: dict[str, Any] = {
        "dataset": f"{directory} (LoCoMo, Maharana et al. ACL 2024, CC BY-NC 4.0)",
        "conversations": len(conversations),
        "sessions": sum(len(c.sessions) for c in conversations),
        "questions": sum(len(c.questions) for c in conversations),
        "references": reference_scores(conversations),
    }
    results["retrieve_memory"] = run(conversations, settings, ABLATION)
    results["retrieve_memory_with_embeddings"] = run(conversations, settings, EMBEDDING_ABLATION, embeddings=True)
    results["relevance_set"] = relevance_ablation(settings, {**ABLATION, **EMBEDDING_ABLATION})
    relevance = results["relevance_set"]
    results["full_at_least_every_ablation"] = {
        "default": _at_least_every(results["retrieve_memory"], "full (default weights)", ABLATION),
        "with embeddings": _at_least_every(
            results["retrieve_memory_with_embeddings"],
            "text + time + entities 0.05 + embeddings (default with a model)",
            EMBEDDING_ABLATION,
        ),
        "relevance set, default": all(
            relevance["full (default weights)"][m] >= relevance[k][m]
            for k in ABLATION
            for m in ("recall_at_5", "paraphrases_recall_at_5")
        ),
        "relevance set, with embeddings": all(
            relevance["text + time + entities 0.05 + embeddings (default with a model)"][m] >= relevance[k][m]
            for k in EMBEDDING_ABLATION
            for m in ("recall_at_5", "paraphrases_recall_at_5")
        ),
    }
    results["targets"] = {
        "recall_any@5_min": 0.94,
        "recall_any@5_min_with_embeddings": 0.95,
        "recall_any@10_min": 0.97,
    }
    write_results("bench_locomo", results)


if __name__ == "__main__":
    main()
