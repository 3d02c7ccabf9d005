"""Imports that meet changes made meanwhile: a fact this deployment ended since an earlier run of the same
import, and an episode forgotten while the import runs (left out, the rest imported, nothing ended by it)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from api_stub.client import MemoryClient
from api_stub.portability import import_file
from tests.factories import entities, record, relation
from tests.test_portability import NewUser, export, remember, write
from worker.facts_text import DEFAULT_PREDICATE
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.identity import entity_key
from worker.models import FactEnd
from worker.settings import Settings


def porto_fact(store: Neo4jGraphStore, user: str) -> tuple[Any, Any]:
    with store._session() as s:
        row = s.run(
            "MATCH (:Entity {user_id: $u})-[r:RELATED_TO]->(:Entity {name: 'Porto'}) RETURN r.invalid_from AS ended,"
            " r.ended_by AS by",
            u=user,
        ).single(strict=True)
    return row["ended"], row["by"]


def test_importing_the_same_file_again_keeps_a_fact_ended_here_since(
    store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser, tmp_path: Path
) -> None:
    """An import restores each fact's state from the file; run again (as for an import cut short) after an
    episode of this deployment ended the fact, it left the fact current again: the correction was lost."""
    user = new_user("import-again")
    store.save_episode(record(user, "user: I live in Porto"), entities("me", "Porto"), [relation("me", "Porto")])
    path = write(tmp_path / "memory.jsonl", export(client, user))
    client.forget_user(user)
    client.import_memory(path)
    porto = FactEnd(source_key=entity_key("me"), predicate=DEFAULT_PREDICATE, target_key="porto")
    moved = record(user, "user: we moved to Lisbon").model_copy(
        update={"ended_facts": (porto,), "accepted_at": time.time()}  # accepted after the erasure above
    )
    store.save_episode(moved, entities("me", "Lisbon"), [relation("me", "Lisbon")])
    ended = porto_fact(store, user)
    assert ended[0] is not None and ended[1] == moved.id
    client.import_memory(path)
    assert porto_fact(store, user) == ended


def test_a_fact_whose_ending_episode_is_forgotten_while_an_import_runs_stays_current(
    store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser, tmp_path: Path
) -> None:
    """The file says an episode ended the fact; that episode was forgotten before the import saved it. The
    restore would have ended the fact by an episode that does not exist, which no forget could undo."""
    user = new_user("import-forget-the-end")
    store.save_episode(record(user, "user: I live in Porto"), entities("me", "Porto"), [relation("me", "Porto")])
    porto = FactEnd(source_key=entity_key("me"), predicate=DEFAULT_PREDICATE, target_key="porto")
    moved = record(user, "user: we moved to Lisbon").model_copy(update={"ended_facts": (porto,)})
    store.save_episode(moved, entities("me", "Lisbon"), [relation("me", "Lisbon")])
    path = write(tmp_path / "memory.jsonl", export(client, user))
    client.forget_user(user)

    def advance(_n: int) -> None:  # after the header line, before the episodes are saved
        client.forget_episode(user, moved.id)

    report = import_file(store, path, advance=advance)
    assert report.episodes_forgotten == 1
    assert porto_fact(store, user) == (None, None)


def test_an_episode_forgotten_while_an_import_runs_is_left_out_and_the_rest_imported(
    settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser, tmp_path: Path
) -> None:
    """A forget of one episode during an import stopped the whole import as if the user had been erased."""
    user = new_user("forget-one-mid-import")
    remember(user, settings, store)
    lines = export(client, user)
    path = write(tmp_path / "memory.jsonl", lines)
    client.forget_user(user)
    gone = next(line["id"] for line in lines if line["kind"] == "episode" and line["session_id"] == "direct")
    forgets: list[str] = []

    def advance(_n: int) -> None:  # after the header line, before any episode is saved
        if not forgets:
            forgets.append(gone)
            client.forget_episode(user, gone)

    report = import_file(store, path, advance=advance)
    episodes = [line["id"] for line in lines if line["kind"] == "episode"]
    assert (report.episodes_created, report.episodes_forgotten) == (len(episodes) - 1, 1)
    assert report.sessions_restored > 0
    stored = {line["id"] for line in export(client, user) if line["kind"] == "episode"}
    assert stored == set(episodes) - {gone}
