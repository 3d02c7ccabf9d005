"""The Neo4j implementation of GraphStore: one driver per process, managed transactions, UNWIND batches."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from neo4j import READ_ACCESS, Driver, GraphDatabase, ManagedTransaction, Query, Session, unit_of_work
from neo4j.exceptions import ClientError
from pydantic import ValidationError

from worker.graph import cypher
from worker.graph.candidates import CANDIDATES, Candidates, candidate_params, candidates_statement, query_terms
from worker.graph.erase import UserErasure
from worker.graph.errors import translated
from worker.graph.facts import KnownFactsReader
from worker.graph.forget import ForgetCounts, forget_transaction
from worker.graph.fusion import FusionWeights, Ranked, fuse
from worker.graph.lucene import terms_query
from worker.graph.params import EpisodeWrite, reindex_rows
from worker.graph.passage import snippet
from worker.graph.portable import Portability
from worker.graph.reextract import Reextraction
from worker.graph.save_tx import save_chunks, save_transaction
from worker.graph.state_reads import StateRequest, read_states
from worker.graph.values import EPOCH
from worker.graph.values import native as _native
from worker.identity import user_tag
from worker.models import (
    Entity,
    EntityHit,
    EpisodeHit,
    EpisodeRecord,
    MemoryContext,
    RelationHit,
    Relationship,
    SaveResult,
    SessionProgress,
    StoreStats,
)
from worker.sessions import WriteState
from worker.settings import Settings
from worker.timeframe import Period

log = logging.getLogger(__name__)

T = TypeVar("T")
BULK_TIMEOUT_FACTOR = 10

AS_OF_CANDIDATES = 3  # times the limit, fused when recall answers as of a time (later episodes are left out)
MAX_WINDOW_CHARS = 4_000  # of a best window read back to cut its passage from (messages can be 20k long)

_SCHEMA_RACE_CODES = ("EquivalentSchemaRuleAlreadyExists", "IndexAlreadyExists", "ConstraintAlreadyExists")


class Neo4jGraphStore(UserErasure, Portability, Reextraction, KnownFactsReader):
    """Thread-safe: the driver pools connections; each call opens a short session."""

    def __init__(
        self,
        uri: str,
        auth: tuple[str, str] | None,
        *,
        database: str = "neo4j",
        connect_timeout_s: float = 2.0,
        retry_time_s: float = 5.0,
        pool_size: int = 20,
        delete_batch: int = 5_000,
        weights: FusionWeights | None = None,
        tx_timeout_s: float = 30.0,
    ) -> None:
        self._database = database
        self._tx_timeout_s = tx_timeout_s
        self.weights = weights or FusionWeights()  # recall's fusion (benchmarks switch signals off to compare)
        self._delete_batch = delete_batch
        self._driver: Driver = GraphDatabase.driver(
            uri,
            auth=auth,
            connection_timeout=connect_timeout_s,
            max_transaction_retry_time=retry_time_s,
            max_connection_pool_size=pool_size,
            connection_acquisition_timeout=max(connect_timeout_s * 2, 5.0),
            notifications_min_severity="OFF",
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> Neo4jGraphStore:
        password = settings.neo4j_password.get_secret_value() if settings.neo4j_password else None
        return cls(
            settings.neo4j_uri,
            (settings.neo4j_user, password) if password is not None else None,
            database=settings.neo4j_database,
            connect_timeout_s=settings.neo4j_connect_timeout_s,
            retry_time_s=settings.neo4j_retry_time_s,
            pool_size=settings.neo4j_pool_size,
            tx_timeout_s=settings.neo4j_tx_timeout_s,
            weights=FusionWeights(
                dense=settings.recall_dense_weight if settings.embedding_model else 0.0,
            ),
        )

    def _session(self) -> Session:
        return self._driver.session(database=self._database)

    def _write(self, session: Session, work: Callable[..., T], *args: Any, bulk: bool = False) -> T:
        """A write transaction with a server-side timeout: a lock wait or a stalled server never holds a
        worker thread for longer (the timeout surfaces as StoreUnavailable, retried with backoff). Bulk
        batches (erasure, reindex) get ten times as long: a batch that cannot finish in time would fail on
        every retry."""
        timeout = self._tx_timeout_s * (BULK_TIMEOUT_FACTOR if bulk else 1)
        return session.execute_write(unit_of_work(timeout=timeout)(work), *args)

    def _read_session(self) -> Session:
        return self._driver.session(database=self._database, default_access_mode=READ_ACCESS)

    def close(self) -> None:
        self._driver.close()

    # --- schema ------------------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        with translated("ensure_schema"), self._session() as session:
            for statement in cypher.SCHEMA:
                try:
                    session.run(statement).consume()
                except ClientError as exc:  # another process created the same rule a moment ago
                    if not any(code in (exc.code or "") for code in _SCHEMA_RACE_CODES):
                        raise
            session.run(cypher.AWAIT_INDEXES, timeout_s=120).consume()
        self.upgrade_predicates()
        self.warm_recall_plans()

    def warm_recall_plans(self) -> None:
        """Plan recall's reads once (planning the candidate read takes ≈ 0.5 s, more than a recall budget
        allows on a busy server); Neo4j caches plans server-wide, so every caller's first recall is fast."""
        w = self.weights
        noon = datetime(2000, 1, 1, 12, tzinfo=UTC)
        with translated("warm_recall_plans"), self._read_session() as session:
            for period in (None, Period(noon, noon, "")):
                # the same parameters, and so the same cached plan, as a real search (types included)
                params = candidate_params(
                    terms_lucene="+user_tag:none +(none)" if w.text else None,
                    period=period if w.period > 0 else None,
                    vector=[0.0] * 384 if w.dense > 0 else None,  # the size bucket of common models' vectors
                    user_id="",
                )
                session.run(candidates_statement(params), params).consume()
            # Plans are cached per parameter types, and for lists per size bucket (0, 1, 2–10, 11–100).
            for hits in (1, 5, 20):
                session.run(
                    cypher.DETAILS,
                    hits=[{"id": "", "seq": 0}] * hits,
                    max_window_chars=1,
                    user_id="",
                    as_of=None,
                    limit=1,
                    max_relations=1,
                    max_neighbours=1,
                    max_seeds=1,
                ).consume()

    # --- write -------------------------------------------------------------------------------------

    def save_episode(
        self,
        record: EpisodeRecord,
        entities: Sequence[Entity],
        relationships: Sequence[Relationship],
        progress: SessionProgress | None = None,
    ) -> SaveResult:
        return self.save_episodes([(record, entities, relationships)], [progress])[0]

    def save_episodes(
        self, writes: Sequence[EpisodeWrite], progress: Sequence[SessionProgress | None] | None = None
    ) -> list[SaveResult]:
        """Several episodes in one transaction: the fulltext-index refresh and the commit are paid once.

        `progress[i]`, when given, is the session line the send of writes[i] leaves. Under the user's and the
        session's locks, an episode accepted before its user was erased, or whose messages the session
        already holds, or whose session moved since its extraction, is not written (write_checks.py). An
        episode whose id is already stored is left as it is: `exists` for the same send, `conflict` for
        other content. One whose id belongs to another user is refused with StoreRequestError and nothing
        of its transaction is written. The same id twice is saved as two sends one after the other: the
        later in a transaction after the earlier's, so that its claim and checks run as they would alone
        (once, the first write per id won and the later one was reported stored, unchecked).
        """
        lines = list(progress) if progress is not None else [None] * len(writes)
        if len(lines) != len(writes):
            raise ValueError(f"{len(lines)} session lines for {len(writes)} episodes")
        results: list[SaveResult | None] = [None] * len(writes)
        pending = list(range(len(writes)))
        while pending:
            now_ids: dict[str, int] = {}
            later = []
            for i in pending:
                if writes[i][0].id in now_ids:
                    later.append(i)
                else:
                    now_ids[writes[i][0].id] = i
            first = {episode_id: writes[i] for episode_id, i in now_ids.items()}
            given = {episode_id: line for episode_id, i in now_ids.items() if (line := lines[i]) is not None}
            token, now = uuid.uuid4().hex, datetime.now(UTC)
            with translated("save_episodes"), self._session() as session:
                by_id = self._write(session, save_transaction, first, given, token, now)
            for episode_id, i in now_ids.items():
                results[i] = by_id[episode_id]
            pending = later
        assert all(r is not None for r in results), "every write is answered by one round"
        return [r for r in results if r is not None]

    def reindex(self, batch: int = 500) -> tuple[int, int]:
        """Give episodes stored before search terms existed their terms and search windows, in pages by id
        (idempotent: only episodes without terms are touched). Returns (reindexed, skipped): an episode that
        cannot be read back as a record is skipped and logged by id, never stopping the run."""
        total, skipped, after = 0, 0, ""
        while True:
            with translated("reindex"), self._session() as session:
                found = [dict(r) for r in session.run(cypher.EPISODES_WITHOUT_TERMS, batch=batch, after=after)]
                if not found:
                    return total, skipped
                after = found[-1]["id"]
                rows, chunks = [], []
                for episode in found:
                    try:
                        episode_terms, episode_chunks = reindex_rows(episode)
                    except ValidationError as exc:
                        skipped += 1
                        log.warning(
                            "reindex skipped an episode",
                            extra={"episode_id": episode["id"], "error_class": type(exc).__name__},
                        )
                        continue
                    rows.append({"id": episode["id"], "terms": episode_terms})
                    chunks.extend(episode_chunks)
                total += self._write(session, self._set_terms, rows, chunks, bulk=True)

    @staticmethod
    def _set_terms(tx: ManagedTransaction, rows: list[dict[str, Any]], chunks: list[dict[str, Any]]) -> int:
        done = {r["id"] for r in tx.run(cypher.SET_TERMS, rows=rows)}  # skips what another run did meanwhile
        save_chunks(tx, [c for c in chunks if c["episode_id"] in done])
        return len(done)

    def write_state(self, user_id: str, key: str, episode_id: str) -> WriteState:
        """What the extract stage checks before it calls the model (one read): the session's line, the
        user's last erasure, and an episode already stored under this id."""
        return self.write_states([StateRequest(user_id, key, episode_id)])[0]

    def write_states(self, requests: Sequence[StateRequest]) -> list[WriteState]:
        """The write state of each request, in order, in one read (worker/graph/state_reads.py), with the
        server-side timeout and the driver's retries of a read."""
        with translated("write_state"), self._read_session() as session:
            return session.execute_read(unit_of_work(timeout=self._tx_timeout_s)(read_states), requests)

    def forget(
        self, user_id: str, at: float, *, episode_id: str | None = None, session_id: str | None = None
    ) -> ForgetCounts:
        """Remove one episode (or every episode of one session) of the user and take back what it added to
        entities and relationships; work for it accepted before `at` is never written (worker/graph/forget.py).
        Idempotent. An episode id stored for another user: StoreRequestError."""
        with translated("forget"), self._session() as session:
            return self._write(session, forget_transaction, user_id, at, episode_id, session_id)

    # --- read --------------------------------------------------------------------------------------

    def search(
        self,
        user_id: str,
        keywords: Sequence[str],
        text: str,
        limit: int,
        timeout_s: float | None = None,
        period: Period | None = None,
        vector: Sequence[float] | None = None,
        as_of: datetime | None = None,
        expansion: Sequence[str] = (),
    ) -> MemoryContext:
        """Two reads: the candidate lists (fused in Python, fusion.py), then the winners' details. as_of: the
        answer as of that time (episodes that happened by then; facts true then current, later ones left out).
        The terms of `keywords` and `expansion` (LLM keywords) the text lacks are searched too."""
        if limit <= 0:
            return MemoryContext()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with translated("search"), self._read_session() as session:
            found = self._candidates(
                session, user_id, keywords, text, timeout_s, period, vector, expansion, self.weights
            )
            if found is None:
                return MemoryContext()
            # with as_of, later episodes are left out by the details read: more are fused than asked for
            ranked = fuse(found, self.weights, limit * AS_OF_CANDIDATES if as_of is not None else limit)
            if not ranked:
                return MemoryContext()
            left = None if deadline is None else max(0.05, deadline - time.monotonic())
            details = session.run(
                Query(cypher.DETAILS, timeout=left),
                hits=[{"id": r.id, "seq": r.seq} for r in ranked],
                max_window_chars=MAX_WINDOW_CHARS,
                user_id=user_id,
                as_of=as_of,
                limit=limit,
                max_relations=limit * 4,
                max_neighbours=limit * 2,
                max_seeds=max(limit, 5),  # each seed costs a scan of its RELATED_TO edges
            ).single(strict=True)
        return self._context(details, ranked, limit, list(found.query))

    def candidates(
        self,
        user_id: str,
        text: str,
        *,
        keywords: Sequence[str] = (),
        timeout_s: float | None = None,
        period: Period | None = None,
        vector: Sequence[float] | None = None,
        expansion: Sequence[str] = (),
    ) -> Candidates | None:
        """The candidate read alone (None when the query has nothing to search): what search() fuses, for
        benchmarks that fuse one read under many weightings."""
        with translated("search"), self._read_session() as session:
            return self._candidates(
                session, user_id, keywords, text, timeout_s, period, vector, expansion, self.weights
            )

    def _candidates(
        self,
        session: Session,
        user_id: str,
        keywords: Sequence[str],
        text: str,
        timeout_s: float | None,
        period: Period | None,
        vector: Sequence[float] | None,
        expansion: Sequence[str],
        weights: FusionWeights,
    ) -> Candidates | None:
        tag = user_tag(user_id)
        query = query_terms(text, [*keywords, *expansion])
        terms_lucene = terms_query(tag, list(query)) if weights.text else None
        use_period = period is not None and weights.period > 0
        use_dense = vector is not None and weights.dense > 0
        if terms_lucene is None and not use_period and not use_dense:
            return None
        params = candidate_params(
            terms_lucene=terms_lucene,
            period=period if use_period else None,
            vector=vector if use_dense else None,
            user_id=user_id,
            query=list(query),
        )
        row = session.run(Query(candidates_statement(params), timeout=timeout_s), params).single(strict=True)
        return Candidates.from_row(row, query)

    def remembered(self, user_id: str, limit: int = 20) -> MemoryContext:
        """What is kept about a user: the most mentioned entities and the strongest relationships (no episodes)."""
        with translated("remembered"), self._read_session() as session:
            row = session.run(cypher.REMEMBERED, user_id=user_id, limit=limit).single(strict=True)
        return self._context(row, limit=limit)

    @staticmethod
    def _context(row: Any, ranked: Sequence[Ranked] = (), limit: int = 20, words: Sequence[str] = ()) -> MemoryContext:
        order = {r.id: r for r in ranked}
        hits = [
            EpisodeHit(
                id=e["id"],
                user_id=e["user_id"],
                session_id=e["session_id"],
                summary=e["summary"] or "",
                created_at=_native(e["created_at"]),
                occurred_at=_native(e["occurred_at"]),
                extraction=e["extraction"] or "",
                score=order[e["id"]].score,
                matched_by=order[e["id"]].matched_by,
                passage=snippet(e["passage"] or "", words),
            )
            for e in row["episodes"]
            if e["id"] in order
        ]
        # the returned episodes' own entities first (most mentioned first), then their one-hop neighbours
        entities = sorted((n for n in row["entities"] if n["hop"] == 0), key=lambda n: -(n["mentions"] or 0))
        entities = entities[: limit * 4] + [n for n in row["entities"] if n["hop"] == 1]
        return MemoryContext(
            related_episodes=hits,
            related_entities=[
                EntityHit(
                    uid=n["uid"],
                    user_id=n["user_id"],
                    name=n["name"],
                    type=n["type"] or "other",
                    description=n["description"] or "",
                    mentions=n["mentions"] or 0,
                    hop=n["hop"],
                )
                for n in entities
            ],
            related_relations=[RelationHit(**{**r, **_times(r)}) for r in row["relations"]],
        )

    # --- erase, health, counts ---------------------------------------------------------------------

    def is_available(self, timeout_s: float = 2.0) -> bool:
        try:
            with translated("ping"), self._session() as session:
                session.run(Query(cypher.PING, timeout=timeout_s)).consume()
            return True
        except Exception as exc:  # any failure means "not available"; the class is what matters in logs
            log.warning("neo4j health check failed", extra={"error_class": type(exc).__name__})
            return False

    def stats(self, user_id: str | None = None) -> StoreStats:
        with translated("stats"), self._session() as session:
            if user_id is None:
                row = session.execute_read(lambda tx: tx.run(cypher.STATS_ALL).single(strict=True))
            else:
                row = session.execute_read(lambda tx: tx.run(cypher.STATS_USER, user_id=user_id).single(strict=True))
            return StoreStats(**dict(row))

    def episode_count(self, user_id: str) -> int:
        """The user's stored episodes, by one index count (stats() counts entities and relationships too)."""
        with translated("episode_count"), self._read_session() as session:
            return int(session.run(cypher.EPISODE_COUNT, user_id=user_id).single(strict=True)["episodes"])

    def run_bare_fulltext(self, user_id: str, keywords: Sequence[str], text: str, k: int = CANDIDATES) -> list[str]:
        """The bare fulltext query of recall's main list: the same Lucene query over the search windows with
        the same k, and nothing else (benchmarks use it as the latency floor)."""
        query = terms_query(user_tag(user_id), list(query_terms(text, keywords)))
        if query is None:
            return []
        with translated("bare_fulltext"), self._read_session() as session:
            return [r["id"] for r in session.run(cypher.BARE_FULLTEXT, lucene=query, k=k)]


def _times(relation: dict[str, Any]) -> dict[str, datetime | None]:
    """A relation's times, read as epoch milliseconds (cypher.DETAILS), as datetimes in UTC."""
    return {
        k: None if relation.get(k) is None else EPOCH + timedelta(milliseconds=relation[k])
        for k in ("valid_from", "invalid_from")
    }
