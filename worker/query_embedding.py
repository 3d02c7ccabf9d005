"""The recall query's embedding, when a model is configured: cached per user in Redis, computed in a small
background pool and waited for only within the budget. A call still running past the budget finishes in
the background and fills the cache (one call per query at a time); recall meanwhile goes on lexical only."""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from worker import erasure
from worker.background import BackgroundCalls
from worker.identity import user_tag
from worker.keys import query_vector_cache
from worker.llm.embeddings import Embedder, pack, unpack
from worker.settings import Settings

log = logging.getLogger(__name__)

MAX_PENDING = 32  # queries being embedded at once; beyond this recall does not wait for one


class QueryEmbedder:
    def __init__(self, settings: Settings, redis: Any | None = None) -> None:
        self._settings = settings
        self._redis = redis
        self._calls: BackgroundCalls[list[float]] = BackgroundCalls("query-embedding", 2, MAX_PENDING)

    @property
    def enabled(self) -> bool:
        return bool(self._settings.embedding_model)

    def vector(self, user_id: str, query: str, budget_ms: int) -> list[float] | None:
        """The query's embedding, or None when disabled, failed or not ready within budget_ms."""
        if not self.enabled:
            return None
        tag, started = user_tag(user_id), time.time()
        key = query_vector_cache(tag, self._digest(query))
        cached = self._cache_get(key)
        if cached is not None:
            return cached
        future = self._calls.submit(key, lambda: self._embed_and_cache(key, query, tag, started))
        if future is None:
            return None
        try:
            return future.result(timeout=budget_ms / 1000)
        except FutureTimeout:
            return None
        except Exception as exc:
            log.warning("query embedding failed", extra={"error_class": type(exc).__name__})
            return None

    def _digest(self, query: str) -> str:
        s = self._settings
        material = f"{s.embedding_query_model or s.embedding_model}\x1f{query}"
        return hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]

    def _embed_and_cache(self, key: str, query: str, tag: str, started: float) -> list[float]:
        vector = Embedder(self._settings).embed([query], query=True)[0]
        if self._redis is not None:
            try:
                ttl_s = self._settings.keywords_cache_ttl_s
                erasure.set_unless_erased(self._redis, tag, started, key, pack(vector), ttl_s)  # erased: nothing
            except Exception as exc:  # the cache is an optimisation
                log.warning("query vector cache write failed", extra={"error_class": type(exc).__name__})
        return vector

    def _cache_get(self, key: str) -> list[float] | None:
        if self._redis is None:
            return None
        try:
            raw = self._redis.get(key)
            return None if raw is None else unpack(raw.decode("ascii") if isinstance(raw, bytes) else raw)
        except Exception as exc:  # unreachable or unreadable: embed again
            log.warning("query vector cache read failed", extra={"error_class": type(exc).__name__})
            return None

    def close(self) -> None:
        self._calls.close()
