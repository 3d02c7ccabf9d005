"""Recall inside the caller's process: keywords → one Cypher read → a MemoryContext, within a budget.

The caller's conversation must never break because memory is unavailable: by default an outage gives an
empty context flagged `degraded` (with the reason); strict=True raises instead.
"""

from __future__ import annotations

import logging
import time
import uuid
from bisect import bisect_left
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from threading import Lock

from pydantic import TypeAdapter, ValidationError

from worker.background import BackgroundCalls
from worker.errors import QueryRejected, StoreError, StoreUnavailable
from worker.graph.candidates import Candidates
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keywords import KeywordExtractor, Keywords, local_keywords
from worker.models import Identifier, MemoryContext, within_calendar
from worker.query_embedding import QueryEmbedder
from worker.settings import Settings
from worker.timeframe import Period, period_in

log = logging.getLogger("memory.recall")
audit = logging.getLogger("memory.audit")


DEADLINE_MARGIN_S = 0.05  # what a caller may wait beyond its budget (thread hand-off, result checks)
CLOSE_WAIT_S = 5.0  # close() waits this long for recalls still running (their queries hold pooled connections)

LATENCY_BUCKETS_S = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class RecallCounters:
    """Process-wide counters and a latency histogram that the metrics endpoint exports."""

    recalls: int = 0
    degraded: int = 0
    foreign_results_dropped: int = 0
    latency_sum_s: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))  # not cumulative
    _lock: Lock = field(default_factory=Lock, repr=False)

    def add(self, *, degraded: bool, dropped: int, latency_s: float) -> None:
        with self._lock:
            self.recalls += 1
            self.degraded += degraded
            self.foreign_results_dropped += dropped
            self.latency_sum_s += latency_s
            slot = bisect_left(LATENCY_BUCKETS_S, latency_s)
            if slot < len(LATENCY_BUCKETS_S):
                self.latency_buckets[slot] += 1

    def cumulative_buckets(self) -> list[tuple[str, int]]:
        """Prometheus histogram buckets: (upper bound, observations ≤ bound), ending with +Inf."""
        with self._lock:
            out, running = [], 0
            for bound, n in zip(LATENCY_BUCKETS_S, self.latency_buckets, strict=True):
                running += n
                out.append((str(bound), running))
            out.append(("+Inf", self.recalls))
            return out


@lru_cache(maxsize=1)
def _identifier() -> TypeAdapter[str]:
    return TypeAdapter(Identifier)  # built once: recall is on the caller's hot path


def check_user_id(user_id: str) -> str:
    try:
        return _identifier().validate_python(user_id)
    except ValidationError as exc:
        raise QueryRejected(exc.errors()[0]["msg"], "user_id") from None


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python, not a count


def check_query(query: str, settings: Settings) -> str:
    if not isinstance(query, str) or not query.strip():
        raise QueryRejected("must not be empty or blank", "query")
    if len(query) > settings.max_query_chars:
        raise QueryRejected(f"{len(query)} characters; the limit is {settings.max_query_chars}", "query")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which JSON lets through: no store or model takes it
        raise QueryRejected("must be valid Unicode text (it holds a lone surrogate)", "query") from None
    return query.strip()


class Recall:
    def __init__(
        self,
        settings: Settings,
        store: Neo4jGraphStore,
        keywords: KeywordExtractor,
        embedder: QueryEmbedder | None = None,
    ) -> None:
        self._settings = settings
        self.store = store
        self._keywords = keywords
        self._embedder = embedder or QueryEmbedder(settings)
        self.counters = RecallCounters()
        running = settings.recall_concurrency
        self._calls: BackgroundCalls[MemoryContext] = BackgroundCalls("recall", running, running)
        self._pings: BackgroundCalls[bool] = BackgroundCalls("health", 1, 1)

    def close(self) -> None:
        """Recalls a caller stopped waiting for may still be mid-query on a pooled connection: closing the
        driver under them breaks (the Bolt buffer is in use), so they get CLOSE_WAIT_S to end first (each
        query's server-side timeout is its recall's remaining budget)."""
        self._calls.close(wait_s=CLOSE_WAIT_S)
        self._pings.close()  # a ping still stuck only finds its driver closed: is_available says False
        self._keywords.close()
        self._embedder.close()
        self.store.close()

    def retrieve(
        self,
        user_id: str,
        query: str,
        *,
        limit: int | None = None,
        budget_ms: int | None = None,
        strict: bool = False,
        as_of: datetime | None = None,
    ) -> MemoryContext:
        user_id = check_user_id(user_id)
        query = check_query(query, self._settings)
        if limit is not None and not (_integer(limit) and 1 <= limit <= 100):
            raise QueryRejected("must be an integer between 1 and 100", "limit")
        if budget_ms is not None and not (_integer(budget_ms) and 10 <= budget_ms <= 60_000):
            raise QueryRejected("must be an integer between 10 and 60000 (milliseconds)", "budget_ms")
        if as_of is not None and as_of.tzinfo is None:
            raise QueryRejected("must be timezone-aware", "as_of")
        if as_of is not None and not within_calendar(as_of):
            raise QueryRejected("falls outside the calendar (years 1 to 9999) in UTC", "as_of")
        started = time.perf_counter()
        budget_s = (budget_ms if budget_ms is not None else self._settings.recall_budget_ms) / 1000
        ask = _Ask(user_id, query, limit, strict, as_of)
        try:
            context = self._within_budget(ask, budget_s)
        except StoreError:  # strict only
            self.counters.add(degraded=True, dropped=0, latency_s=time.perf_counter() - started)
            raise
        context, dropped = self._only_own(user_id, context)
        latency_s = time.perf_counter() - started
        self.counters.add(degraded=context.degraded, dropped=dropped, latency_s=latency_s)
        audit.info(
            "recall",
            extra={
                "event": "recall",
                "user_id": user_id,
                "episode_ids": [e.id for e in context.related_episodes],
                "latency_ms": round(latency_s * 1000, 2),
                "degraded": context.degraded,
            },
        )
        return context

    def store_available(self, timeout_s: float) -> bool:
        """A ping of Neo4j that the caller waits for at most timeout_s (plus the margin): the query's own
        timeout is enforced by the server, which a frozen one never does. One ping at a time; a caller that
        comes while it is still stuck waits for that one, so stuck pings never pile up."""
        future = self._pings.submit("ping", lambda: self.store.is_available(timeout_s))
        if future is None:
            return False
        try:
            return future.result(timeout=timeout_s + DEADLINE_MARGIN_S)
        except FutureTimeout:
            return False

    def _within_budget(self, ask: _Ask, budget_s: float) -> MemoryContext:
        """The work runs in a bounded pool and the caller waits at most the budget plus a margin, for a free
        slot and then for the answer: a stalled store or cache (a blocked socket, a pool waiting for a
        connection, client retries) cannot hold the caller's turn; the late call ends in the background,
        bounded by its own timeouts. Local keywords are CPU work in this thread, before the deadline (the
        first Chinese query loads jieba's dictionary, 1.4-2 s here): the deadline, which guards against stalled
        I/O, starts after them."""
        user_id, strict = ask.user_id, ask.strict
        local = local_keywords(ask.query, self._settings.max_keywords)
        deadline = time.perf_counter() + budget_s + DEADLINE_MARGIN_S
        # The search gets what is left of the budget when it starts: a wait for a slot is charged to it.
        search = lambda: self._search(ask, max(0.01, deadline - DEADLINE_MARGIN_S - time.perf_counter()), local)  # noqa: E731
        future = self._calls.submit(uuid.uuid4().hex, search, wait_s=max(0.0, deadline - time.perf_counter()))
        if future is None:  # every slot held for the whole budget (recalls stuck on a stalled store)
            return self._degraded(user_id, "busy", strict)
        try:
            return future.result(timeout=max(0.0, deadline - time.perf_counter()))
        except FutureTimeout:
            future.add_done_callback(_log_late_failure)
            return self._degraded(user_id, "timeout", strict)
        except StoreError:
            raise  # strict: _search degrades by itself otherwise
        except Exception as exc:  # a bug or a corrupt cache entry must not break the caller's turn either
            if strict:
                raise StoreUnavailable(f"recall failed ({type(exc).__name__})", cause=type(exc).__name__) from exc
            log.error("recall failed", extra={"user_id": user_id, "error_class": type(exc).__name__})
            return MemoryContext(degraded=True, reason=f"recall failed ({type(exc).__name__})")

    def _degraded(self, user_id: str, why: str, strict: bool) -> MemoryContext:
        reason = f"recall did not finish within its budget ({why})"
        if strict:
            raise StoreUnavailable(reason, cause=f"Recall{why.title()}")
        return _degraded_context(user_id, reason, f"Recall{why.title()}")

    def _inputs(self, ask: _Ask, budget_s: float, local: list[str]) -> _Inputs:
        """What the store is asked with: keywords (LLM ones within their budget), the query's vector (within
        its budget), the period the query names, and the time left for the reads."""
        started = time.perf_counter()
        keyword_budget = max(1, int(min(self._settings.keywords_budget_ms, budget_s * 1000 / 2)))
        found = self._keywords.keywords(ask.user_id, ask.query, budget_ms=keyword_budget, local=local)
        vector = None
        if self._embedder.enabled:
            left_ms = (budget_s - (time.perf_counter() - started)) * 1000
            vector = self._embedder.vector(
                ask.user_id, ask.query, budget_ms=max(1, int(min(self._settings.embedding_budget_ms, left_ms / 2)))
            )
        remaining = max(0.05, budget_s - (time.perf_counter() - started))
        period = period_in(ask.query, ask.as_of or datetime.now(UTC))  # "last month" as of the time asked about
        return _Inputs(found, vector, period, remaining)

    def _search(self, ask: _Ask, budget_s: float, local: list[str]) -> MemoryContext:
        user_id, query = ask.user_id, ask.query
        given = self._inputs(ask, budget_s, local)
        try:
            context = self.store.search(
                user_id,
                given.keywords.words,
                query,
                ask.limit or self._settings.recall_limit,
                timeout_s=given.timeout_s,
                period=given.period,
                vector=given.vector,
                as_of=ask.as_of,
                expansion=given.keywords.expansion,
            )
        except StoreError as exc:
            if ask.strict:
                raise
            cause = exc.cause or type(exc).__name__
            context = _degraded_context(user_id, f"store unavailable ({cause})", cause)
        return context

    def candidates(self, user_id: str, query: str, budget_ms: int = 10_000) -> Candidates | None:
        """The candidate lists a recall of this query would fuse, asked with the same inputs: benchmarks fuse
        one read under many weightings. Not budgeted like retrieve(): errors raise."""
        ask = _Ask(check_user_id(user_id), check_query(query, self._settings), None, True, None)
        local = local_keywords(ask.query, self._settings.max_keywords)
        given = self._inputs(ask, budget_ms / 1000, local)
        return self.store.candidates(
            ask.user_id,
            ask.query,
            keywords=given.keywords.words,
            timeout_s=given.timeout_s,
            period=given.period,
            vector=given.vector,
            expansion=given.keywords.expansion,
        )

    def _only_own(self, user_id: str, context: MemoryContext) -> tuple[MemoryContext, int]:
        """Drop anything that is not the user's. The store already filters: a drop here is a bug, so alert."""
        episodes = [e for e in context.related_episodes if e.user_id == user_id]
        entities = [e for e in context.related_entities if e.user_id == user_id]
        relations = [r for r in context.related_relations if r.user_id == user_id]
        dropped = (
            len(context.related_episodes)
            - len(episodes)
            + len(context.related_entities)
            - len(entities)
            + len(context.related_relations)
            - len(relations)
        )
        if dropped:
            log.error(
                "ALERT: recall returned another user's data; dropped", extra={"user_id": user_id, "dropped": dropped}
            )
            context = context.model_copy(
                update={"related_episodes": episodes, "related_entities": entities, "related_relations": relations}
            )
        return context, dropped


@dataclass(frozen=True)
class _Inputs:
    keywords: Keywords
    vector: list[float] | None
    period: Period | None
    timeout_s: float


@dataclass(frozen=True)
class _Ask:
    """One recall as asked (checked)."""

    user_id: str
    query: str
    limit: int | None
    strict: bool
    as_of: datetime | None


def _degraded_context(user_id: str, reason: str, error_class: str) -> MemoryContext:
    log.warning("recall degraded", extra={"user_id": user_id, "error_class": error_class})
    return MemoryContext(degraded=True, reason=reason)


def _log_late_failure(future: Future[MemoryContext]) -> None:
    """A recall the caller stopped waiting for: its failure is nobody's answer, but it is logged."""
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.warning("late recall failed", extra={"error_class": type(exc).__name__})
