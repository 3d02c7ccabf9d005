"""import_memory: a user's memory, exported as JSON Lines (api_stub/export_format.py), loaded back.

Import makes no LLM call. It reads the file three times: first it validates every line (JSON, kind order,
fields, the end line's counts), then it checks the episode ids (one stored here for another user), and a bad
line stops it before anything is written, with its line number; then it saves the episodes in batches
through the ordinary persist transaction (so mentions, weights and support are counted exactly as when they
were first saved, and an episode already stored is left as it is), then restores entity and relationship
details and session progress. Every step is idempotent: a second import changes nothing, and an import cut
short (a store outage) is finished by running it again.

Choices: episode ids are kept (they are unique across the deployment, so `as_user` into the deployment that
still holds the original user's episodes is refused: move a user by exporting, forgetting, importing). An
imported episode is accepted at import time (`accepted_at`), so an earlier forget or erasure of the user does
not drop it: importing is an explicit act of putting memory back; an erasure while the import runs stops it.
Search windows are restored as exported (their embeddings only when this deployment embeds with the model
that made them); with MEMORY_STORE_CONTENT=false no content is imported.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from api_stub.export_format import (
    BY_KIND,
    KINDS,
    READABLE,
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
from worker.graph.params import EpisodeWrite, spans_from_content, spans_from_windows
from worker.identity import entity_key, entity_uid
from worker.models import EpisodeRecord, Identifier
from worker.sessions import erased_since, progress_key

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
    episodes_forgotten: int = 0  # forgotten (the episode or its session) while the import ran: left out
    entities_restored: int
    relationships_restored: int
    sessions_restored: int  # sessions whose progress moved forward


# --- import -------------------------------------------------------------------------------------------


def _lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) of each line; a blank line is skipped."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ImportRejected(number, "not UTF-8") from None
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
    order, last, total, ended, dimension = 0, 0, 0, False, 0
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
            if line.version not in READABLE:
                raise ImportRejected(
                    number, f"format version {line.version}; this deployment reads {', '.join(map(str, READABLE))}"
                )
            header = line
        elif isinstance(line, EpisodeLine):
            assert header is not None
            sizes = {len(v) for v in line.window_vectors} | ({dimension} if dimension else set())
            if len(sizes) > 1:
                raise ImportRejected(number, "episode: window vectors of different dimensions")
            dimension = next(iter(sizes), 0)
            try:
                _record(line, as_user or header.user_id, 0.0, store_content=True, keep_vectors=True)
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


def _record(
    line: EpisodeLine, user_id: str, accepted_at: float, *, store_content: bool, keep_vectors: bool
) -> EpisodeRecord:
    """The episode to save: its search windows exactly as exported (from the content's message lines when
    the export has none), with their embeddings when they were made by this deployment's model."""
    content = line.content if store_content else None
    fields = line.model_dump(
        exclude={"kind", "entities", "relationships", "search_windows", "window_vectors", "accepted_at", "content"}
    )
    spans: tuple[tuple[int, int], ...] = ()
    if content:
        spans = spans_from_windows(line.search_windows) if line.search_windows else spans_from_content(content)
    return EpisodeRecord(
        **fields,
        user_id=user_id,
        content=content,
        message_spans=spans,
        window_vectors=tuple(line.window_vectors) if content and keep_vectors else (),
        accepted_at=accepted_at,
    )


def import_file(
    store: Neo4jGraphStore,
    path: Path,
    *,
    as_user: str | None = None,
    store_content: bool = True,
    embedding_model: str | None = None,
    advance: Callable[[int], None] = lambda _n: None,
) -> ImportReport:
    """Validate the whole file, then write it (see the module's notes); `advance(n)` after n more lines.
    embedding_model: this deployment's (window embeddings of another model are left out)."""
    header, _total = validate_file(path, as_user)
    user_id = as_user or header.user_id
    keep_vectors = header.embedding_model == embedding_model  # vectors of one model mean nothing to another
    authors = _refuse_foreign_ids(store, path, user_id)
    store.ensure_schema()  # a deployment no worker has started yet
    accepted_at = time.time()
    outcomes: Counter[str] = Counter()
    restored: Counter[str] = Counter()
    pending: dict[str, list[Any]] = {"episode": [], "entity": [], "relationship": [], "session": []}

    def flush(kind: str) -> None:
        rows = pending.get(kind)
        if not rows:
            return
        try:
            if kind == "episode":
                saved = _save(store, rows)
                if "forgotten" in saved and _erased(store, user_id, rows[saved.index("forgotten")][0], accepted_at):
                    raise StoreRequestError("the user was erased", cause="ErasedDuringImport")
                outcomes.update(saved)  # else only that episode or session was forgotten: the rest goes on
            else:
                restored[kind] += store.restore(kind, user_id, rows, accepted_at, authors)
        except StoreRequestError as exc:
            if exc.cause != "ErasedDuringImport":
                raise
            raise QueryRejected(
                "the user was erased while the import ran; run it again to import anew", "file"
            ) from None
        advance(len(rows))
        rows.clear()

    previous = ""
    for number, obj in _lines(path):
        kind, line = _parsed(number, obj)
        if kind != previous:  # kinds come in order: the last rows of one go before the next
            flush(previous)
            previous = kind
        if isinstance(line, EpisodeLine):
            record = _record(line, user_id, accepted_at, store_content=store_content, keep_vectors=keep_vectors)
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
        episodes_forgotten=outcomes["forgotten"],
        entities_restored=restored["entity"],
        relationships_restored=restored["relationship"],
        sessions_restored=restored["session"],
    )


def _refuse_foreign_ids(store: Neo4jGraphStore, path: Path, user_id: str) -> set[str]:
    """Episode ids are unique in a deployment: one the file holds that is stored for another user refuses the
    whole import before anything is written (a read of the ids, in batches). The file's episode ids."""
    batch: list[str] = []
    ids: set[str] = set()

    def check() -> None:
        foreign = store.foreign_episodes(user_id, batch) if batch else []
        if foreign:
            raise QueryRejected(
                f"episode {foreign[0]} is stored for another user here: episode ids are unique in a deployment; "
                "move a user by export, forget, import",
                "file",
            )
        batch.clear()

    for _number, obj in _lines(path):
        if isinstance(obj, dict) and obj.get("kind") == "episode":
            batch.append(TypeAdapter(Identifier).validate_python(obj.get("id")))  # as saved: stripped
            ids.add(batch[-1])
            if len(batch) >= 500:
                check()
    check()
    return ids


def _erased(store: Neo4jGraphStore, user_id: str, record: EpisodeRecord, accepted_at: float) -> bool:
    """Was an episode of the import refused because the user was erased (rather than the episode or its
    session forgotten) since the import was accepted?"""
    state = store.write_state(user_id, progress_key(user_id, record.session_id), record.id)
    return erased_since(accepted_at, state.erased_at)


def _save(store: Neo4jGraphStore, writes: list[EpisodeWrite]) -> list[str]:
    """The outcome of each episode of a batch, saved as the persist stage saves them (no session line)."""
    try:
        results = store.save_episodes(writes)
    except StoreRequestError as exc:  # nothing of its transaction was written (a repeated id's earlier one may be)
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
            **line.model_dump(exclude={"kind", "source", "target", "weight"}),
        }
    assert isinstance(line, SessionLine)
    key = progress_key(user_id, line.session_id)
    return {"key": key, **line.model_dump(include={"session_id", "extracted", "digest", "hashes"})}
