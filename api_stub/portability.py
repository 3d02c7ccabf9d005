"""export_user and import_memory: a user's memory out as JSON Lines (api_stub/export_format.py) and back in.

Export streams in pages (worker/graph/portable.py): constant memory, whatever the user's history.

Import makes no LLM call. It reads the file twice: first it validates every line (JSON, kind order, fields,
the end line's counts), and a bad line stops it before anything is written, with its line number; then it
saves the episodes in batches through the ordinary persist transaction (so mentions, weights and support
are counted exactly as when they were first saved, and an episode already stored is left as it is), then
restores entity and relationship details and session progress. Every step is idempotent: a second import
changes nothing, and an import cut short (a store outage) is finished by running it again.

Choices: episode ids are kept (they are unique across the deployment, so `as_user` into the deployment that
still holds the original user's episodes is refused: move a user by exporting, forgetting, importing). An
imported episode is accepted at import time (`accepted_at`), so an earlier forget or erasure of the user does
not drop it: importing is an explicit act of putting memory back. Search windows are rebuilt from the
content's message lines, as `memctl reindex` does; with MEMORY_STORE_CONTENT=false no content is imported.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from api_stub.export_format import (
    BY_KIND,
    KINDS,
    VERSION,
    Counts,
    EndLine,
    EntityLine,
    EpisodeLine,
    HeaderLine,
    RelationshipLine,
    SessionLine,
)
from worker.errors import QueryRejected, StoreRequestError, StoreUnavailable
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.graph.params import EpisodeWrite, spans_from_content
from worker.identity import entity_key, entity_uid
from worker.llm.embeddings import pack
from worker.models import Entity, EpisodeRecord, Relationship
from worker.sessions import progress_key

EPISODE_BATCH = 100
_PLURAL = {"episode": "episodes", "entity": "entities", "relationship": "relationships", "session": "sessions"}
DETAIL_BATCH = 500


class ImportRejected(QueryRejected):
    """A line of the file is not a valid export line: nothing of the file was written."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}", "file")
        self.line = line


class ImportReport(BaseModel):
    user_id: str
    episodes_created: int  # written now
    episodes_present: int  # already stored (an earlier import, or the same episode)
    episodes_conflicting: int  # the id is stored with other content: left as it is
    episodes_dropped: int  # an erasure of the user ran during the import: what it accepted before is dropped
    entities_restored: int
    relationships_restored: int
    sessions_restored: int  # sessions whose progress moved forward


# --- export -------------------------------------------------------------------------------------------


def export_lines(store: Neo4jGraphStore, user_id: str) -> Iterator[str]:
    """The user's memory as JSON Lines (each ends with a newline); nothing is read until iterated."""
    counts = Counts(**store.export_counts(user_id))
    header = HeaderLine(version=VERSION, user_id=user_id, exported_at=datetime.now(UTC), counts=counts)
    yield _dump(header)
    written: Counter[str] = Counter()
    for row in store.export_episodes(user_id):
        written["episodes"] += 1
        yield _dump(_episode_line(row))
    for row in store.export_entities(user_id):
        written["entities"] += 1
        yield _dump(EntityLine(**{k: row[k] for k in EntityLine.model_fields if k != "kind"}))
    for row in store.export_relationships(user_id):
        written["relationships"] += 1
        fields = {k: row[k] for k in RelationshipLine.model_fields if k != "kind"}
        yield _dump(RelationshipLine(**{**fields, "weight": float(fields["weight"])}))
    for row in store.export_sessions(user_id):
        written["sessions"] += 1
        yield _dump(SessionLine(**{k: row[k] for k in SessionLine.model_fields if k != "kind"}))
    yield _dump(EndLine(lines=Counts(**{k: written[k] for k in Counts.model_fields})))


def _dump(line: BaseModel) -> str:
    return line.model_dump_json() + "\n"


def _episode_line(row: dict[str, Any]) -> EpisodeLine:
    episode = row["episode"]
    names = {uid: name for uid, name, _type, _description in row["mentions"]}
    entities = [Entity(name=name, type=type_ or "other", description=d or "") for _, name, type_, d in row["mentions"]]
    added: Iterable[tuple[Any, ...]]
    if episode.get("rel_sources") is not None:
        added = zip(
            episode["rel_sources"],
            episode["rel_targets"],
            episode["rel_weights"],
            episode["rel_descriptions"],
            strict=True,
        )
    else:  # saved before episodes recorded what they added: an equal share of what lists them
        added = (tuple(r) for r in row["legacy_relationships"] or [])
    relationships = [
        Relationship(source=names[s], target=names[t], weight=float(w), description=d or "")
        for s, t, w, d in added
        if s in names and t in names
    ]
    vectors = row["vectors"]
    packed = [pack(v) for v in vectors] if len(vectors) == row["windows"] and all(vectors) else []
    fields = {k: episode.get(k) for k in EpisodeLine.model_fields if k in episode and k != "kind"}
    return EpisodeLine(**fields, entities=entities, relationships=relationships, window_vectors=packed)


# --- import -------------------------------------------------------------------------------------------


def _lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) of each line; a blank line is skipped."""
    with path.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                yield number, json.loads(text)
            except json.JSONDecodeError as exc:
                raise ImportRejected(number, f"not JSON ({exc.msg})") from None


def _parsed(number: int, obj: Any) -> tuple[str, BaseModel]:
    kind = obj.get("kind") if isinstance(obj, dict) else None
    model = BY_KIND.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise ImportRejected(number, f"kind must be one of {', '.join(KINDS)}")
    try:
        return str(kind), model.model_validate(obj)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise ImportRejected(number, f"{kind}.{where}: {error['msg']}") from None


def validate_file(path: Path, as_user: str | None = None) -> tuple[HeaderLine, int]:
    """The header and the number of lines, or ImportRejected naming the first bad line."""
    header: HeaderLine | None = None
    seen: Counter[str] = Counter()
    order, last, total, ended = 0, 0, 0, False
    for number, obj in _lines(path):
        total, last = total + 1, number
        kind, line = _parsed(number, obj)
        if ended:
            raise ImportRejected(number, "nothing may follow the end line")
        if header is None and not isinstance(line, HeaderLine):
            raise ImportRejected(number, "the first line must be the header")
        if KINDS.index(kind) < order or (kind == "header" and header is not None):
            raise ImportRejected(number, f"a {kind} line after the {KINDS[order]} lines")
        order = KINDS.index(kind)
        if isinstance(line, HeaderLine):
            if line.version != VERSION:
                raise ImportRejected(number, f"format version {line.version}; this deployment reads {VERSION}")
            header = line
        elif isinstance(line, EpisodeLine):
            assert header is not None
            try:
                _record(line, as_user or header.user_id, 0.0, store_content=True)
            except ValidationError as exc:
                raise ImportRejected(number, f"episode: {exc.errors()[0]['msg']}") from None
        elif isinstance(line, EndLine):
            if line.lines != Counts(**{k: seen[k] for k in Counts.model_fields}):
                raise ImportRejected(number, "the end line's counts differ from the lines in the file")
            ended = True
        seen[_PLURAL.get(kind, kind)] += 1
    if header is None:
        raise ImportRejected(last + 1, "the file is empty")
    if not ended:
        raise ImportRejected(last + 1, "no end line: the file was cut short")
    return header, total


def _record(line: EpisodeLine, user_id: str, accepted_at: float, *, store_content: bool) -> EpisodeRecord:
    content = line.content if store_content else None
    fields = line.model_dump(exclude={"kind", "entities", "relationships", "window_vectors", "accepted_at", "content"})
    return EpisodeRecord(
        **fields,
        user_id=user_id,
        content=content,
        message_spans=spans_from_content(content) if content else (),
        window_vectors=tuple(line.window_vectors) if content else (),
        accepted_at=accepted_at,
    )


def import_file(
    store: Neo4jGraphStore,
    path: Path,
    *,
    as_user: str | None = None,
    store_content: bool = True,
    advance: Callable[[int], None] = lambda _n: None,
) -> ImportReport:
    """Validate the whole file, then write it (see the module's notes); `advance(n)` after n more lines."""
    header, _total = validate_file(path, as_user)
    user_id = as_user or header.user_id
    store.ensure_schema()  # a deployment no worker has started yet
    accepted_at = time.time()
    outcomes: Counter[str] = Counter()
    restored: Counter[str] = Counter()
    pending: dict[str, list[Any]] = {"episode": [], "entity": [], "relationship": [], "session": []}

    def flush(kind: str) -> None:
        rows = pending.get(kind)
        if not rows:
            return
        if kind == "episode":
            outcomes.update(_save(store, rows))
        else:
            restored[kind] += store.restore(kind, user_id, rows)
        advance(len(rows))
        rows.clear()

    previous = ""
    for number, obj in _lines(path):
        kind, line = _parsed(number, obj)
        if kind != previous:  # kinds come in order: the last rows of one go before the next
            flush(previous)
            previous = kind
        if isinstance(line, EpisodeLine):
            record = _record(line, user_id, accepted_at, store_content=store_content)
            pending[kind].append((record, line.entities, line.relationships))
        elif kind in pending:
            pending[kind].append(_detail_row(line, user_id))
        else:
            advance(1)  # header, end
            continue
        if len(pending[kind]) >= (EPISODE_BATCH if kind == "episode" else DETAIL_BATCH):
            flush(kind)
    flush(previous)
    return ImportReport(
        user_id=user_id,
        episodes_created=outcomes["created"],
        episodes_present=outcomes["exists"],
        episodes_conflicting=outcomes["conflict"],
        episodes_dropped=outcomes["forgotten"],
        entities_restored=restored["entity"],
        relationships_restored=restored["relationship"],
        sessions_restored=restored["session"],
    )


def _save(store: Neo4jGraphStore, writes: list[EpisodeWrite]) -> list[str]:
    """The outcome of each episode of a batch, saved as the persist stage saves them (no session line)."""
    try:
        results = store.save_episodes(writes)
    except StoreRequestError as exc:  # nothing of the batch was written
        raise QueryRejected(
            f"{exc}: episode ids are unique in a deployment; move a user by export, forget, import", "file"
        ) from None
    if any(r.outcome == "erasing" for r in results):
        raise StoreUnavailable("import: the user is being erased right now; run the import again after it")
    return [r.outcome for r in results]


def _detail_row(line: BaseModel, user_id: str) -> dict[str, Any]:
    """The row the restore statement of an entity, relationship or session line takes."""
    if isinstance(line, EntityLine):
        uid = entity_uid(user_id, entity_key(line.name))
        return {"uid": uid, **line.model_dump(include={"type", "description", "mentions", "first_seen", "last_seen"})}
    if isinstance(line, RelationshipLine):
        return {
            "source_uid": entity_uid(user_id, entity_key(line.source)),
            "target_uid": entity_uid(user_id, entity_key(line.target)),
            "description": line.description,
            "support": line.support,
        }
    assert isinstance(line, SessionLine)
    key = progress_key(user_id, line.session_id)
    return {"key": key, **line.model_dump(include={"session_id", "extracted", "digest", "hashes"})}
