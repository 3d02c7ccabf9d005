"""The Neo4j implementation of GraphStore: one driver per process, managed transactions, UNWIND batches."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from neo4j import Driver, GraphDatabase, ManagedTransaction, Query, Session
from neo4j.exceptions import ClientError

from worker.errors import StoreRequestError
from worker.graph import cypher
from worker.graph.errors import translated
from worker.graph.lucene import build_query
from worker.graph.params import build_save_params
from worker.identity import user_tag
from worker.models import (
    DeleteReport,
    Entity,
    EntityHit,
    EpisodeHit,
    EpisodeRecord,
    MemoryContext,
    RelationHit,
    Relationship,
    SaveResult,
    StoreStats,
)
from worker.ranking import reciprocal_rank_fusion
from worker.settings import Settings

log = logging.getLogger(__name__)

_SCHEMA_RACE_CODES = ("EquivalentSchemaRuleAlreadyExists", "IndexAlreadyExists", "ConstraintAlreadyExists")


def _native(value: Any) -> Any:
    """neo4j.time values → datetime; everything else unchanged."""
    to_native = getattr(value, "to_native", None)
    return to_native() if callable(to_native) else value


class Neo4jGraphStore:
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
    ) -> None:
        self._database = database
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
        )

    def _session(self) -> Session:
        return self._driver.session(database=self._database)

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

    # --- write -------------------------------------------------------------------------------------

    def save_episode(
        self, record: EpisodeRecord, entities: Sequence[Entity], relationships: Sequence[Relationship]
    ) -> SaveResult:
        params = build_save_params(record, entities, relationships)
        token = uuid.uuid4().hex
        now = datetime.now(UTC)

        def work(tx: ManagedTransaction) -> SaveResult:
            claim = tx.run(cypher.CLAIM_EPISODE, episode=params.episode, token=token).single(strict=True)
            if claim["user_id"] != record.user_id:
                raise StoreRequestError(f"episode {record.id} already belongs to another user")
            if not claim["created"]:
                return SaveResult(episode_id=record.id, created=False)
            common: dict[str, Any] = {"episode_id": record.id, "user_id": record.user_id, "now": now}
            n_entities = 0
            if params.entities:
                n_entities = tx.run(
                    cypher.SAVE_ENTITIES, entities=params.entities, user_tag=user_tag(record.user_id), **common
                ).single(strict=True)["entities"]
            n_relationships = 0
            if params.relationships:
                n_relationships = tx.run(
                    cypher.SAVE_RELATIONSHIPS, relationships=params.relationships, **common
                ).single(strict=True)["relationships"]
            tx.run(cypher.RELEASE_CLAIM, episode_id=record.id).consume()
            return SaveResult(episode_id=record.id, created=True, entities=n_entities, relationships=n_relationships)

        with translated("save_episode"), self._session() as session:
            return session.execute_write(work)

    # --- read --------------------------------------------------------------------------------------

    def search(self, user_id: str, keywords: Sequence[str], text: str, limit: int) -> MemoryContext:
        query = build_query(user_tag(user_id), keywords, text)
        if query is None or limit <= 0:
            return MemoryContext()
        k = max(limit * 4, 20)

        def work(tx: ManagedTransaction) -> MemoryContext:
            row = tx.run(cypher.SEARCH_CANDIDATES, lucene=query, k=k, user_id=user_id).single(strict=True)
            by_text = [(r[0], _native(r[2])) for r in row["by_text"]]
            by_entity = {r[0]: list(r[3]) for r in row["by_entity"]}
            created = dict(by_text) | {r[0]: _native(r[2]) for r in row["by_entity"]}
            fused = reciprocal_rank_fusion([[i for i, _ in by_text], list(by_entity)])
            ranked = sorted(fused, key=lambda i: (fused[i], created[i]), reverse=True)[:limit]
            if not ranked:
                return MemoryContext()
            detail = tx.run(cypher.HYDRATE, ids=ranked, user_id=user_id, max_relations=limit * 4).single(strict=True)
            return self._context(ranked, fused, {i for i, _ in by_text}, by_entity, detail, limit)

        with translated("search"), self._session() as session:
            return session.execute_read(work)

    @staticmethod
    def _context(
        ranked: list[str],
        fused: dict[str, float],
        text_hits: set[str],
        entity_hits: dict[str, list[str]],
        detail: Any,
        limit: int,
    ) -> MemoryContext:
        episodes = {e["id"]: e for e in detail["episodes"]}
        hits = []
        for episode_id in ranked:
            e = episodes.get(episode_id)
            if e is None:  # deleted between the two reads
                continue
            matched = (["text"] if episode_id in text_hits else []) + [
                f"entity:{name}" for name in entity_hits.get(episode_id, [])
            ]
            hits.append(
                EpisodeHit(
                    id=e["id"],
                    user_id=e["user_id"],
                    session_id=e["session_id"],
                    summary=e["summary"] or "",
                    created_at=_native(e["created_at"]),
                    occurred_at=_native(e["occurred_at"]),
                    extraction=e["extraction"] or "",
                    score=fused[episode_id],
                    matched_by=matched,
                )
            )
        entities = sorted(detail["entities"], key=lambda n: -(n["mentions"] or 0))[: limit * 4]
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
                )
                for n in entities
            ],
            related_relations=[RelationHit(**r) for r in detail["relations"]],
        )

    # --- erase, health, counts ---------------------------------------------------------------------

    def delete_user(self, user_id: str) -> DeleteReport:
        """Batches of delete_batch nodes, each its own transaction, so 100k nodes never build one huge tx."""
        with translated("delete_user"), self._session() as session:
            relationships = session.execute_read(
                lambda tx: tx.run(cypher.COUNT_USER_RELATIONSHIPS, user_id=user_id).single(strict=True)["n"]
            )
            counts = [self._delete_in_batches(session, statement, user_id) for statement in cypher.DELETE_USER_BATCHES]
        log.info("deleted user graph", extra={"user_id": user_id, "episodes": counts[0], "entities": counts[1]})
        return DeleteReport(user_id=user_id, episodes=counts[0], entities=counts[1], relationships=relationships)

    def _delete_in_batches(self, session: Session, statement: str, user_id: str) -> int:
        def batch(tx: ManagedTransaction) -> int:
            n: int = tx.run(statement, user_id=user_id, batch=self._delete_batch).single(strict=True)["n"]
            return n

        total = 0
        while (n := session.execute_write(batch)) > 0:
            total += n
        return total

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

    def run_bare_fulltext(self, query: str, k: int) -> list[str]:
        """The bare episode fulltext query (benchmarks use it as the latency floor)."""
        with translated("bare_fulltext"), self._session() as session:
            return session.execute_read(
                lambda tx: [r["id"] for r in tx.run(cypher.BARE_EPISODE_FULLTEXT, lucene=query, k=k)]
            )
