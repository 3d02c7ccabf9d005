"""MemoryClient: the caller's side. add_episode validates and enqueues (it never waits for the LLM)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    from api_stub.forget_part import ForgetPartReport
    from api_stub.recall import RecallCounters

from api_stub.client_memory import MemoryTransfer, audit
from worker.errors import EpisodeRejected, QueueFull
from worker.models import Episode, Limits, MemoryContext, build_episode
from worker.pipeline import episode_payload
from worker.settings import Settings

State = Literal["persisted", "unchanged", "forgotten", "conflict", "dead_lettered", "pending"]


class EpisodeReceipt(BaseModel):
    episode_id: str
    task_id: str  # the final (persist) task of the episode's chain


class EpisodeState(BaseModel):
    episode_id: str
    task_id: str
    # unchanged: the session already holds every message sent, nothing new to store; forgotten: the user was
    # erased after this was accepted, nothing written; conflict: the episode id is stored with other
    # content (an explicit id names one send), nothing written
    state: State


class ForgetReport(BaseModel):
    user_id: str
    episodes: int
    entities: int
    relationships: int
    session_progress: int
    dead_letters: int
    cached_keywords: int


class MemoryClient(MemoryTransfer):
    """Thread-safe; create one per process and reuse it (it holds the broker connection pool)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._limits = Limits(
            max_messages=settings.max_messages,
            max_message_chars=settings.max_message_chars,
            max_episode_chars=settings.max_episode_chars,
        )
        self._app: Any = None
        self._recaller: Any = None
        self._redis: Any = None
        self._inflight: Any = None
        self._lock = threading.Lock()  # what the client opens lazily is opened once, and close() sees it

    @classmethod
    def from_env(cls) -> MemoryClient:
        return cls(Settings.load())

    @property
    def settings(self) -> Settings:
        return self._settings

    def _celery(self) -> Any:
        app = self._app
        if app is None:
            with self._lock:
                if self._app is None:
                    self._app = _client_app(self._settings)
                app = self._app
        return app

    # --- write ---------------------------------------------------------------------------------------

    def validate(
        self,
        user_id: str,
        session_id: str,
        messages: Sequence[Mapping[str, Any]] | Sequence[Any],
        *,
        episode_id: str | None = None,
        occurred_at: datetime | None = None,
    ) -> Episode:
        """The checks add_episode makes, without enqueueing: raises EpisodeRejected naming the field."""
        return build_episode(
            user_id,
            session_id,
            [m.model_dump() if isinstance(m, BaseModel) else m for m in messages],
            limits=self._limits,
            episode_id=episode_id,
            occurred_at=occurred_at,
        )

    def add_episode(
        self,
        user_id: str,
        session_id: str,
        messages: Sequence[Mapping[str, Any]] | Sequence[Any],
        *,
        episode_id: str | None = None,
        occurred_at: datetime | None = None,
    ) -> EpisodeReceipt:
        """Validate, enqueue extract → persist, return at once. Invalid input enqueues nothing."""
        episode = self.validate(user_id, session_id, messages, episode_id=episode_id, occurred_at=occurred_at)
        return self.enqueue(episode)

    def add_episodes(self, items: Iterable[Mapping[str, Any]]) -> list[EpisodeReceipt]:
        """All items are validated first; if one is invalid, none is enqueued (EpisodeRejected says which)."""
        episodes = []
        for index, item in enumerate(items):
            try:
                episodes.append(
                    self.validate(
                        item.get("user_id", ""),
                        item.get("session_id", ""),
                        item.get("messages", []),
                        episode_id=item.get("episode_id"),
                        occurred_at=item.get("occurred_at"),
                    )
                )
            except EpisodeRejected as exc:
                raise EpisodeRejected(exc.reason, f"[{index}].{exc.field}" if exc.field else f"[{index}]") from None
        self._admit(len(episodes))
        return [self.enqueue(e, admitted=True) for e in episodes]

    def _in_flight(self) -> Any:
        inflight = self._inflight
        if inflight is None:
            with self._lock:
                if self._inflight is None:
                    from redis import Redis

                    from worker.inflight import InFlight

                    self._inflight = InFlight(Redis.from_url(self._settings.redis_url, socket_timeout=5))
                inflight = self._inflight
        return inflight

    def _admit(self, count: int) -> None:
        """Backpressure: refuse (QueueFull, nothing enqueued) when the backlog would pass the limit."""
        if count > self._settings.max_in_flight:
            raise EpisodeRejected(f"{count} episodes at once: more than MEMORY_MAX_IN_FLIGHT allows in flight")
        in_flight = self._in_flight().count()
        if in_flight + count > self._settings.max_in_flight:
            raise QueueFull(in_flight, self._settings.max_in_flight)

    def enqueue(self, episode: Episode, *, admitted: bool = False) -> EpisodeReceipt:
        """Record the episode as in flight, then publish its chain: a message lost by the broker is found
        again by the sweep (see worker/inflight.py). Raises QueueFull when the backlog is at its limit."""
        return self.enqueue_payload(episode_payload(episode), admitted=admitted)

    def enqueue_payload(self, payload: dict[str, Any], *, admitted: bool = False) -> EpisodeReceipt:
        """enqueue() for a payload already built (episode_payload, or a re-extraction's)."""
        if not admitted:
            self._admit(1)
        episode_id, user_id = payload["episode"]["id"], payload["episode"]["user_id"]
        self._in_flight().add(episode_id, user_id, payload)
        return EpisodeReceipt(episode_id=episode_id, task_id=self.publish(payload))

    def publish(self, payload: dict[str, Any]) -> str:
        """Publish extract → persist for an episode payload; returns the final (persist) task id."""
        from celery import chain

        from worker.celery_app import extract_signature, persist_signature, persist_task_id

        app = self._celery()
        episode_id = payload["episode"]["id"]
        app.backend.forget(persist_task_id(episode_id))  # an outcome of an earlier send is not this one's
        flow = chain(extract_signature(app, payload, episode_id), persist_signature(app, episode_id))
        return str(flow.apply_async().id)

    def republish(self, payload: dict[str, Any]) -> str:
        """Publish again what an in-flight or dead-letter record holds: an episode (extract → persist) or an
        extraction (persist alone, no LLM call); returns the final (persist) task id."""
        if "episode" in payload:
            return self.publish(payload)
        from worker.celery_app import persist_signature, persist_task_id

        app = self._celery()
        app.backend.forget(persist_task_id(payload["episode_id"]))  # the failed attempt's outcome is not this one's
        return str(persist_signature(app, payload["episode_id"], payload).apply_async().id)

    def recover(self, payload: dict[str, Any]) -> str | None:
        """What the in-flight sweep does with a silent record: a send whose outcome is final already (its
        record could not be closed) is closed, not sent again (None); any other is published again as this
        very send (found stored, it reports persisted). Returns the final task id when published."""
        from worker.celery_app import persist_task_id

        episode_id = str(payload["episode"]["id"] if "episode" in payload else payload["episode_id"])
        if self._celery().AsyncResult(persist_task_id(episode_id)).state == "SUCCESS":
            self._in_flight().done(episode_id)
            return None
        return self.republish({**payload, "recovered": True})

    def wait(self, receipts: Sequence[EpisodeReceipt], timeout_s: float = 60.0) -> list[EpisodeState]:
        """Each episode's state once final, or 'pending' for those not final when the timeout ends."""
        app = self._celery()
        states: dict[str, State] = {}
        deadline = time.monotonic() + timeout_s
        while True:
            for receipt in receipts:
                if receipt.task_id in states:
                    continue
                result = app.AsyncResult(receipt.task_id)
                if result.state == "SUCCESS":
                    value = result.result if isinstance(result.result, dict) else {}
                    states[receipt.task_id] = value.get("status", "persisted")
            if len(states) == len({r.task_id for r in receipts}) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        return [
            EpisodeState(episode_id=r.episode_id, task_id=r.task_id, state=states.get(r.task_id, "pending"))
            for r in receipts
        ]

    # --- recall and erasure -----------------------------------------------------------------------------

    def _recall(self) -> Any:
        recaller = self._recaller
        if recaller is None:
            with self._lock:
                if self._recaller is None:
                    self._redis, self._recaller = _recall_parts(self._settings)
                recaller = self._recaller
        return recaller

    def retrieve_memory(
        self,
        user_id: str,
        query: str,
        *,
        limit: int | None = None,
        budget_ms: int | None = None,
        strict: bool = False,
        as_of: datetime | None = None,
    ) -> MemoryContext:
        """The user's most relevant memories for the query, in this process, within the budget. Relations
        come current first, each with valid_from/invalid_from; as_of (timezone-aware) answers as of that time:
        episodes that happened by then, facts true then current, facts not yet true left out.

        Store or cache outages give an empty context with degraded=True and the reason (strict: raise).
        Bad input raises QueryRejected naming the field.
        """
        result: MemoryContext = self._recall().retrieve(
            user_id, query, limit=limit, budget_ms=budget_ms, strict=strict, as_of=as_of
        )
        return result

    def remembered(self, user_id: str, limit: int = 20) -> MemoryContext:
        """What is kept about the user (most mentioned entities, strongest relationships): for "what do you
        know about me" requests and for the demo. Raises if the store cannot be reached."""
        from api_stub.recall import check_user_id

        result: MemoryContext = self._recall().store.remembered(check_user_id(user_id), limit)
        return result

    def forget_user(self, user_id: str) -> ForgetReport:
        """Erase everything kept about the user; idempotent. Raises if the store cannot be reached."""
        from api_stub.recall import check_user_id
        from worker import erasure
        from worker.deadletter import DeadLetterStore
        from worker.erasure import purge_cached_keywords
        from worker.identity import user_tag

        user_id = check_user_id(user_id)
        recall = self._recall()
        started = time.perf_counter()
        # First the mark: from its commit on, work accepted before now (queued, retrying, running) is
        # dropped by both stages and by the persist transaction; then what is stored goes.
        erased_at = time.time()
        window = recall.store.mark_erased(user_id, erased_at)
        try:
            erasure.mark(self._redis, user_tag(user_id), erased_at)
            graph = recall.store.delete_user(user_id, window=window)
            dead_letters = DeadLetterStore(self._redis).purge_user(user_id)
            self._in_flight().purge_user(user_id, accepted_until=erased_at)
            cached = purge_cached_keywords(self._redis, user_id)
        finally:  # persists of the user wait no longer (a failed erasure is retried by its caller)
            recall.store.erasure_done(user_id, window)
        report = ForgetReport(
            user_id=user_id,
            episodes=graph.episodes,
            entities=graph.entities,
            relationships=graph.relationships,
            session_progress=graph.session_progress,
            dead_letters=dead_letters,
            cached_keywords=cached,
        )
        audit.info(
            "forget",
            extra={
                "event": "forget",
                "user_id": user_id,
                "removed": report.model_dump(exclude={"user_id"}),
                "latency_ms": round((time.perf_counter() - started) * 1000, 2),
            },
        )
        return report

    def forget_episode(self, user_id: str, episode_id: str) -> ForgetPartReport:
        """Forget one episode: it, its text and index entries, and exactly what it added to entities and
        relationships; work for it accepted before now never writes it again. Idempotent; an episode id
        stored for another user is left alone and answered as an unknown one. See api_stub/forget_part.py."""
        return self._forget_part(user_id, episode_id=episode_id)

    def forget_session(self, user_id: str, session_id: str) -> ForgetPartReport:
        """Forget every episode of one session, and the session's extraction progress (a later send of the
        session is extracted again). Idempotent."""
        return self._forget_part(user_id, session_id=session_id)

    def _forget_part(self, user_id: str, **which: str) -> ForgetPartReport:
        from api_stub.forget_part import forget_part
        from api_stub.recall import check_user_id

        user_id = check_user_id(user_id)
        recall = self._recall()
        started = time.perf_counter()
        report = forget_part(recall.store, self._redis, user_id, **which)
        audit.info(
            "forget",
            extra={
                "event": "forget_" + ("episode" if "episode_id" in which else "session"),
                "user_id": user_id,
                **which,
                "removed": report.model_dump(exclude={"user_id", "episode_id", "session_id"}),
                "latency_ms": round((time.perf_counter() - started) * 1000, 2),
            },
        )
        return report

    # --- operations ----------------------------------------------------------------------------------

    def redis(self) -> Any:
        """The Redis connection of recall and erasure (budget-bounded timeouts)."""
        self._recall()
        return self._redis

    def recall_counters(self) -> RecallCounters:
        counters: RecallCounters = self._recall().counters
        return counters

    def health(self, timeout_s: float = 2.0) -> dict[str, bool]:
        """A real round trip to each service: {"redis": ..., "neo4j": ...}."""
        try:
            redis_ok = bool(self.redis().ping())
        except Exception:
            redis_ok = False
        return {"redis": redis_ok, "neo4j": self._recall().store_available(timeout_s)}

    def close(self) -> None:
        """Release the connections the client opened (result backend, Redis, Neo4j); used again, it opens
        them anew. The broker's producer pool is kombu's, one per broker URL for the whole process, shared
        by every client and Celery app in it: it stays. Call it once the client's threads are done with it:
        a connection in use is closed too."""
        with self._lock:
            app, inflight, recaller, redis = self._app, self._inflight, self._recaller, self._redis
            self._app = self._inflight = self._recaller = self._redis = None
        if app is not None:  # its pool's connections, the pub/sub of a persist task sent alone included
            app.backend.client.connection_pool.disconnect()
        if inflight is not None:
            inflight.close()
        self._close_bulk()
        if recaller is not None:
            recaller.close()
            redis.close()


def _client_app(settings: Settings) -> Any:
    """The client's Celery app: the workers' configuration, publishing only."""
    from celery import Celery

    from worker.celery_app import celery_config

    app = Celery("memory-client", set_as_current=False)
    app.conf.update({k: v for k, v in celery_config(settings).items() if k != "include"})
    app.conf.task_send_sent_event = False  # one Redis round trip less per episode; workers report receipt
    # One result backend (and connection pool) for all the client's threads instead of one per thread, which
    # close() could not reach. The client reads outcomes (GET) and forgets them (DEL), which a redis-py client
    # does from any thread; a persist task sent alone (republish) also makes Celery subscribe to its result,
    # and Celery 5.7 (the floor in pyproject.toml) guards that pub/sub with a lock of its own.
    app.conf.result_backend_thread_safe = True
    _ = app.backend  # built now, under the client's lock: Celery's property would let two threads build one each
    return app


def _recall_parts(s: Settings) -> tuple[Any, Any]:
    """(recall's Redis client, Recall): the same store as the workers', but answering within the recall
    budget and without the driver's retry loop."""
    from redis import Redis

    from api_stub.recall import Recall
    from worker.graph.neo4j_store import Neo4jGraphStore
    from worker.keywords import KeywordExtractor
    from worker.query_embedding import QueryEmbedder

    budget_s = s.recall_budget_ms / 1000
    store = Neo4jGraphStore.from_settings(
        s.model_copy(
            update={"neo4j_connect_timeout_s": min(s.neo4j_connect_timeout_s, budget_s), "neo4j_retry_time_s": 0.0}
        )
    )
    redis = Redis.from_url(s.redis_url, socket_timeout=budget_s, socket_connect_timeout=budget_s)
    return redis, Recall(s, store, KeywordExtractor(s, redis=redis), QueryEmbedder(s, redis=redis))
