"""Dense embeddings through litellm (`litellm.embedding`, any provider or OpenAI-compatible server).

Optional: with MEMORY_EMBEDDING_MODEL unset nothing here runs. Search windows are embedded in the extract
stage (so a persist retry or replay never pays again) and travel to persist as packed float16 vectors;
recall embeds the query with MEMORY_EMBEDDING_QUERY_MODEL (default: the same model), within its budget.
"""

from __future__ import annotations

import base64
import logging
import struct
from collections.abc import Sequence
from typing import Any

from worker.errors import LLMError
from worker.llm.classify import classify_llm_error
from worker.llm.client import litellm_module
from worker.settings import Settings

log = logging.getLogger(__name__)

BATCH = 64  # inputs per embedding request


def pack(vector: Sequence[float]) -> str:
    """A vector as base64 of little-endian float16: 2 bytes a dimension in task payloads and dead letters."""
    return base64.b64encode(struct.pack(f"<{len(vector)}e", *vector)).decode("ascii")


def unpack(packed: str) -> list[float]:
    raw = base64.b64decode(packed)
    return list(struct.unpack(f"<{len(raw) // 2}e", raw))


class Embedder:
    def __init__(self, settings: Settings) -> None:
        if not settings.embedding_model:
            raise ValueError("MEMORY_EMBEDDING_MODEL is not set")
        self._settings = settings

    def embed(self, texts: Sequence[str], *, query: bool) -> list[list[float]]:
        """One vector per text, in order; a failed call raises LLMError, classified like an LLM call's."""
        s = self._settings
        model = (s.embedding_query_model or s.embedding_model) if query else s.embedding_model
        assert model is not None
        kwargs: dict[str, Any] = {
            "model": model,
            "timeout": s.embedding_timeout_s,
            "num_retries": 0,  # litellm's own retries: off, the task layer retries
            "max_retries": 0,  # the OpenAI SDK's retries: off as well
        }
        if s.embedding_api_base:
            kwargs["api_base"] = s.embedding_api_base
        if s.embedding_api_key:
            kwargs["api_key"] = s.embedding_api_key.get_secret_value()
        vectors: list[list[float]] = []
        for start in range(0, len(texts), BATCH):
            chunk = list(texts[start : start + BATCH])
            try:
                response = litellm_module().embedding(input=chunk, **kwargs)
            except Exception as exc:
                failure = classify_llm_error(exc)
                log.warning(
                    "embedding call failed",
                    extra={"model": model, "error_class": failure.error_class, "reason": failure.reason},
                )
                raise LLMError(
                    f"embedding call failed: {failure.reason}",
                    transient=failure.transient,
                    cause=failure.error_class,
                    retry_after_s=failure.retry_after_s,
                ) from None
            data = sorted(response.data, key=lambda d: d["index"])
            if len(data) != len(chunk):
                raise LLMError(f"{len(data)} embeddings for {len(chunk)} inputs", transient=True, cause="BadAnswer")
            vectors.extend([float(x) for x in d["embedding"]] for d in data)
        return vectors
