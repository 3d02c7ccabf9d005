"""Connections of one worker process: created on first use (never at import), once per process."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from worker.deadletter import DeadLetterStore
from worker.graph.group_commit import GroupCommit
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.graph.state_reads import GroupRead
from worker.inflight import InFlight
from worker.llm.client import LLMClient, build_client
from worker.offline import MODEL_NAME as OFFLINE
from worker.settings import Settings, get_settings
from worker.stats import Stats


@dataclass
class Runtime:
    settings: Settings
    redis: Any
    store: Neo4jGraphStore
    llm: LLMClient | None
    dead_letters: DeadLetterStore
    inflight: InFlight
    stats: Stats
    group_commit: GroupCommit
    group_read: GroupRead
    _schema_ready: bool = field(default=False)
    _schema_lock: threading.Lock = field(default_factory=threading.Lock)

    def ensure_schema(self) -> None:
        """Once per process. One thread at a time: on a Neo4j just started, planning the schema and recall
        statements takes seconds, and every task thread doing it at once takes several times as long (while
        each holds its message)."""
        if self._schema_ready:
            return
        with self._schema_lock:
            if not self._schema_ready:
                self.store.ensure_schema()
                self._schema_ready = True

    def close(self) -> None:
        self.store.close()
        self.redis.close()


MAX_READS = 64  # extract reads in one query (a worker process runs up to 64 extract threads by default)

_lock = threading.Lock()
_runtime: Runtime | None = None
_pid: int | None = None


def runtime() -> Runtime:
    global _runtime, _pid
    with _lock:
        if _runtime is None or _pid != os.getpid():  # a forked child builds its own connections
            from redis import Redis

            settings = get_settings()
            redis = Redis.from_url(settings.redis_url, socket_timeout=10, health_check_interval=30)
            store = Neo4jGraphStore.from_settings(settings)
            stats = Stats(redis)
            _runtime = Runtime(
                settings=settings,
                redis=redis,
                store=store,
                llm=None if settings.llm_model == OFFLINE else build_client(settings, lambda: redis),
                dead_letters=DeadLetterStore(redis),
                inflight=InFlight(redis),
                stats=stats,
                group_commit=GroupCommit(
                    store,
                    settings.persist_batch,
                    settings.persist_batch_wait_ms / 1000,
                    _batch_wait_s(settings),
                    stats.committed,
                ),
                group_read=GroupRead(
                    store.write_states, MAX_READS, settings.extract_read_wait_ms / 1000, _read_wait_s(settings)
                ),
            )
            _pid = os.getpid()
        return _runtime


def _batch_wait_s(settings: Settings) -> float:
    """How long a persist task waits for the transaction holding its episode: the one before it and its own,
    each with the driver's retries on top of the server-side timeout, and a margin for the linger and a
    refused batch written again one by one."""
    return 2 * (settings.neo4j_tx_timeout_s + settings.neo4j_retry_time_s) + 60.0


def _read_wait_s(settings: Settings) -> float:
    """How long an extract task waits for the read holding its own: the read, with the driver's retries on
    top of its server-side timeout, and a margin for the linger."""
    return settings.neo4j_tx_timeout_s + settings.neo4j_retry_time_s + 10.0


def shutdown_runtime() -> None:
    global _runtime
    with _lock:
        if _runtime is not None and _pid == os.getpid():
            _runtime.close()
        _runtime = None
