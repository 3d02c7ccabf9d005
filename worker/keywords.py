"""Keywords for recall: local extraction always; LLM keywords only when enabled, within a time budget,
cached per user in Redis. When nothing is extracted, the query text itself is the keyword."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Literal

from worker import erasure
from worker.background import BackgroundCalls
from worker.identity import user_tag
from worker.keys import keywords_cache
from worker.llm.answer import parse_answer
from worker.llm.client import LLMClient, build_client
from worker.offline import MODEL_NAME as OFFLINE
from worker.prompts import keywords as prompt
from worker.prompts.template import PromptTemplate
from worker.settings import Settings
from worker.stats import Stats
from worker.stopwords import ENGLISH_STOP

log = logging.getLogger(__name__)

_CJK_RUN = re.compile(r"[\u4e00-\u9fff]+")
_LATIN_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’_-]*")
Source = Literal["local", "local+llm", "local+cache"]


@dataclass(frozen=True)
class Keywords:
    words: list[str]
    source: Source
    llm_timed_out: bool = False
    expansion: tuple[str, ...] = ()  # the LLM's words (fresh or cached): recall searches their terms too


def local_keywords(query: str, max_keywords: int) -> list[str]:
    """jieba TF-IDF keywords for Chinese, stopword-filtered words for English; the query itself if none."""
    words: list[str] = []
    if _CJK_RUN.search(query):
        import jieba
        import jieba.analyse  # loaded on first use, not at import

        jieba.setLogLevel(logging.WARNING)

        words.extend(w for w in jieba.analyse.extract_tags(query, topK=max_keywords) if _CJK_RUN.search(w))
    for match in _LATIN_WORD.finditer(query):
        word = match.group(0).lower().strip("'’-_")
        if len(word) > 1 and word not in ENGLISH_STOP:
            words.append(word)
    unique = list(dict.fromkeys(words))[:max_keywords]
    return unique or [query.strip()]


def merge(first: list[str], second: list[str], limit: int) -> list[str]:
    seen: dict[str, str] = {}
    for word in [*first, *second]:
        seen.setdefault(word.casefold(), word)
    return list(seen.values())[:limit]


MAX_PENDING = 16  # LLM keyword calls running at once; beyond this recall does not start another


class KeywordExtractor:
    """One per process. LLM calls run in a small pool and may outlive their budget (their answer fills the
    cache); at most MAX_PENDING at once, one per query, under the shared LLM rate limit, and counted in the
    LLM cost metrics like extractions."""

    def __init__(self, settings: Settings, redis: Any | None = None, llm: LLMClient | None = None) -> None:
        self._settings = settings
        self._redis = redis
        self._llm = llm
        self._template = PromptTemplate.load(prompt.DEFAULT, settings.prompt_keywords_file)
        self._calls: BackgroundCalls[list[str]] = BackgroundCalls("llm-keywords", 4, MAX_PENDING)

    @property
    def llm_enabled(self) -> bool:
        return self._settings.llm_keywords_enabled and self._settings.llm_model != OFFLINE

    def keywords(
        self, user_id: str, query: str, budget_ms: int | None = None, local: list[str] | None = None
    ) -> Keywords:
        """`local`: the query's local keywords when the caller computed them already."""
        limit = self._settings.max_keywords
        local = local if local is not None else local_keywords(query, limit)
        if not self.llm_enabled:
            return Keywords(local, "local")
        tag, started = user_tag(user_id), time.time()
        key = keywords_cache(tag, self._digest(query))
        cached = self._cache_get(key)
        if cached is not None:
            return Keywords(merge(local, cached, limit), "local+cache", expansion=tuple(cached))
        future = self._calls.submit(key, lambda: self._ask_and_cache(key, query, tag, started))
        if future is None:  # too many calls pending already: answer without
            return Keywords(local, "local", llm_timed_out=True)
        budget_s = (budget_ms if budget_ms is not None else self._settings.keywords_budget_ms) / 1000
        try:
            from_llm = future.result(timeout=budget_s)
        except FutureTimeout:
            return Keywords(local, "local", llm_timed_out=True)  # the answer, when it comes, is cached
        except Exception as exc:
            log.warning("llm keywords failed", extra={"error_class": type(exc).__name__})
            return Keywords(local, "local")
        return Keywords(merge(local, from_llm, limit), "local+llm", expansion=tuple(from_llm))

    def _digest(self, query: str) -> str:
        material = f"{self._settings.llm_model}\x1f{self._template.version}\x1f{query}"
        return hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]

    def _client(self) -> LLMClient:
        if self._llm is None:  # with the shared rate limit (the same Redis bucket as the extractions)
            self._llm = build_client(self._settings, (lambda: self._redis) if self._redis is not None else None)
        return self._llm

    def _ask_and_cache(self, key: str, query: str, tag: str, started: float) -> list[str]:
        reply = self._client().complete(
            lambda schema_in_prompt: prompt.build_messages(self._template, query, schema_in_prompt=schema_in_prompt),
            prompt.ResponseModel,
        )
        if self._redis is not None:  # paid for like an extraction: in the same cost metrics
            usage = reply.usage
            Stats(self._redis).llm_used(usage.calls, usage.prompt_tokens, usage.completion_tokens, usage.cost_usd)
        answer = parse_answer(reply.text, prompt.KeywordsAnswer)
        words = [w.strip() for w in answer.keywords if w.strip()]
        if self._redis is not None:
            try:
                value, ttl_s = json.dumps(words, ensure_ascii=False), self._settings.keywords_cache_ttl_s
                erasure.set_unless_erased(self._redis, tag, started, key, value, ttl_s)  # erased meanwhile: nothing
            except Exception as exc:  # the cache is an optimisation; recall goes on without it
                log.warning("keyword cache write failed", extra={"error_class": type(exc).__name__})
        return words

    def _cache_get(self, key: str) -> list[str] | None:
        if self._redis is None:
            return None
        try:
            raw = self._redis.get(key)
            return None if raw is None else [str(w) for w in json.loads(raw)]
        except Exception as exc:  # unreachable or unreadable: ask again
            log.warning("keyword cache read failed", extra={"error_class": type(exc).__name__})
            return None

    def close(self) -> None:
        self._calls.close()
