"""The ablation of bench_locomo on this project's own relevance set (tests/data/relevance.json): every
weighting scored on the lexical queries (English and Chinese) and on the paraphrases (no shared term),
with window embeddings from a local e5 server stored once (weightings without `dense` ignore them)."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from redis import Redis

from api_stub.recall import Recall
from tests.relevance import load_dataset, recall_at_k, store_dataset
from tests.servers import embedding_env, embedding_server
from worker.graph.fusion import FusionWeights
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.identity import user_tag
from worker.keys import keywords_cache_pattern
from worker.keywords import KeywordExtractor
from worker.query_embedding import QueryEmbedder
from worker.settings import Settings


def relevance_ablation(settings: Settings, weights: dict[str, FusionWeights]) -> dict[str, Any]:
    data = load_dataset()
    server = embedding_server(Path(tempfile.mkdtemp()) / "e5.log").start()
    update: dict[str, Any] = {k.removeprefix("MEMORY_").lower(): v for k, v in embedding_env(server).items()}
    update["embedding_api_key"] = SecretStr(update["embedding_api_key"])
    update["embedding_budget_ms"] = 20_000  # measure ranking, not whether a cold query beat 300 ms
    settings = settings.model_copy(update=update)
    store = Neo4jGraphStore.from_settings(settings)
    redis = Redis.from_url(settings.redis_url)
    recall = Recall(settings, store, KeywordExtractor(settings), QueryEmbedder(settings, redis=redis))
    prefix = f"bench-relab-{uuid.uuid4().hex[:6]}"
    results: dict[str, Any] = {}
    try:
        keys = store_dataset(data, prefix, store, settings)

        def ask(user: str, text: str) -> Any:
            context = recall.retrieve(user, text, limit=5, budget_ms=20_000)
            if context.degraded:
                raise RuntimeError(f"degraded recall: {context.reason}")
            return context

        for name, w in weights.items():
            store.weights = w
            lexical, _ = recall_at_k(data, prefix, keys, ask, k=5)
            paraphrases, _ = recall_at_k(data, prefix, keys, ask, k=5, queries=data.paraphrases)
            results[name] = {"recall_at_5": round(lexical, 3), "paraphrases_recall_at_5": round(paraphrases, 3)}
    finally:
        server.stop()
        for user in data.users:
            store.delete_user(f"{prefix}-{user}")
            for key in redis.scan_iter(keywords_cache_pattern(user_tag(f"{prefix}-{user}"))):
                redis.delete(key)
        recall.close()
        redis.close()
    return {"queries": len(data.queries), "paraphrases": len(data.paraphrases), **results}
