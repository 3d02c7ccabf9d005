"""Export and import of a user's memory: a round trip gives the same memory back (and the same recall), a
second import changes nothing, a bad file writes nothing, and the export reads in pages."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from api_stub.client import MemoryClient
from api_stub.portability import ImportRejected
from tests.factories import entities, record, relation
from tests.ingest_helpers import graph_facts
from tests.servers import ServerProcess
from tests.test_http import AUTH, server  # noqa: F401  (the fixture)
from tests.test_policy_and_dlq import memctl
from worker.errors import QueryRejected, StoreRequestError
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.llm.embeddings import pack
from worker.models import Limits, MemoryContext, build_episode
from worker.pipeline import episode_payload, extract_stage, persist_stage
from worker.sessions import progress_key
from worker.settings import Settings

NewUser = Callable[[str], str]
# What is allowed to differ between two exports of the same memory: when the export was made, and when this
# deployment accepted each episode (an import accepts it anew).
IGNORED = {"header": {"exported_at"}, "episode": {"accepted_at"}}


def remember(user: str, settings: Settings, store: Neo4jGraphStore) -> None:
    """Memory as the service makes it (offline extraction through both stages: session progress included),
    plus episodes saved with weighted, described relationships and window embeddings."""
    talk = [{"role": "user", "content": "My sister Ada Lovelace lives in Porto and works at a bakery."}]
    longer = [*talk, {"role": "assistant", "content": "Nice."}, {"role": "user", "content": "Bo visits Ada."}]
    for session, messages in (("trip", talk), ("trip", longer), ("cello", [{"role": "user", "content": "Bo plays"}])):
        payload = episode_payload(build_episode(user, session, messages, limits=Limits()))
        extracted = extract_stage(payload, settings=settings, store=store, llm=None)
        assert persist_stage(extracted, save=store.save_episode)["status"] == "persisted"
    first = record(user, "user: Ada and Bo went climbing", session_id="direct")
    second = record(user, "user: Ada and Bo went sailing", session_id="direct").model_copy(
        update={"message_spans": ((0, 29),), "window_vectors": (pack([0.5, -0.25, 1.0]),)}
    )
    store.save_episode(first, entities("Ada", "Bo"), [relation("Ada", "Bo", 0.5, "climbs with")])
    store.save_episode(second, entities("Ada"), [relation("Ada", "Bo", 0.25, "sails with")])
    quoted = "user: she wrote\nassistant: this line is quoted\nuser: ok\nassistant: fine"  # 3 messages, not 4
    second_start, third_start = quoted.index("user: ok"), quoted.index("assistant: fine")
    spans = ((0, second_start - 1), (second_start, third_start - 1), (third_start, len(quoted)))
    vectors = tuple(pack([float(i), 1.0]) for i in range(3))
    kept = record(user, quoted, session_id="quoted")
    store.save_episode(kept.model_copy(update={"message_spans": spans, "window_vectors": vectors}), entities("Ada"), [])


def export(client: MemoryClient, user: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in client.export_user(user)]


def comparable(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in line.items() if k not in IGNORED.get(line["kind"], set())} for line in lines]


def answer(context: MemoryContext) -> dict[str, Any]:
    """All of a recall's answer but scores (index statistics move when documents are deleted and added)."""
    return context.model_dump(exclude={"related_episodes": {"__all__": {"score"}}})


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_export_forget_import_gives_the_same_memory_and_recall_and_a_second_import_changes_nothing(
    settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser, tmp_path: Path
) -> None:
    user = new_user("round-trip")
    remember(user, settings, store)
    before = export(client, user)
    kinds = [line["kind"] for line in before]
    assert kinds[0] == "header" and kinds[-1] == "end"
    assert (
        before[0]["counts"]
        == before[-1]["lines"]
        == {
            "episodes": 6,
            "entities": kinds.count("entity"),
            "relationships": kinds.count("relationship"),
            "sessions": 2,
        }
    )
    sailing = next(line for line in before if line["kind"] == "episode" and "sailing" in (line["content"] or ""))
    assert sailing["relationships"] == [
        {
            "source": "Ada",
            "target": "Bo",
            "predicate": "related_to",
            "description": "sails with",
            "weight": 0.25,
            "valid_from": "",
            "ends": [],
        }
    ]
    assert sailing["window_vectors"] == [pack([0.5, -0.25, 1.0])]
    quoted = next(line for line in before if line["kind"] == "episode" and line["session_id"] == "quoted")
    assert quoted["search_windows"] == [[0, 55], [0, 71], [47, 71]] and len(quoted["window_vectors"]) == 3
    ada_bo = next(line for line in before if line["kind"] == "relationship" and line["source"] == "Ada")
    assert (ada_bo["weight"], ada_bo["support"]) == (0.75, 2)
    recalled = client.retrieve_memory(user, "where does my sister Ada live")
    assert recalled.related_episodes

    gone = client.forget_user(user)
    assert (gone.episodes, gone.session_progress) == (6, 2)  # not the search windows and tombstones too
    assert graph_facts(store, user)["episodes"] == 0
    path = write(tmp_path / "memory.jsonl", before)
    report = client.import_memory(path)
    assert (report.episodes_created, report.episodes_present, report.sessions_restored) == (6, 0, 2)

    after = export(client, user)
    assert comparable(after) == comparable(before)
    again = client.retrieve_memory(user, "where does my sister Ada live")
    assert answer(again) == answer(recalled)

    second = client.import_memory(path)
    assert (second.episodes_created, second.episodes_present, second.sessions_restored) == (0, 6, 0)
    assert comparable(export(client, user)) == comparable(after)
    assert [line.get("accepted_at") for line in export(client, user)] == [line.get("accepted_at") for line in after]

    # The session's progress came back: the same history sent again is not extracted again.
    talk = [{"role": "user", "content": "My sister Ada Lovelace lives in Porto and works at a bakery."}]
    longer = [*talk, {"role": "assistant", "content": "Nice."}, {"role": "user", "content": "Bo visits Ada."}]
    resent = episode_payload(build_episode(user, "trip", longer, limits=Limits()))
    assert extract_stage(resent, settings=settings, store=store, llm=None)["status"] == "unchanged"


def test_import_as_another_user_and_ids_already_held_by_someone_else_are_refused(
    settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser, tmp_path: Path
) -> None:
    user, moved = new_user("from"), new_user("to")
    remember(user, settings, store)
    path = write(tmp_path / "memory.jsonl", export(client, user))
    with pytest.raises(QueryRejected, match="unique in a deployment"):  # the episodes are still the first user's
        client.import_memory(path, as_user=moved)
    assert graph_facts(store, moved)["episodes"] == 0
    client.forget_user(user)
    report = client.import_memory(path, as_user=moved)
    assert report.user_id == moved and report.episodes_created == 6
    assert graph_facts(store, user)["episodes"] == 0
    assert client.retrieve_memory(moved, "Ada Porto bakery").related_episodes


def damaged(lines: list[dict[str, Any]], how: str) -> tuple[list[dict[str, Any]], int, str]:
    """The export damaged one way, the line number it should be refused at, and words of the reason."""
    lines = [dict(line) for line in lines]
    episode = next(i for i, line in enumerate(lines) if line["kind"] == "episode")
    if how == "field":
        lines[episode]["created_at"] = "yesterday"
        return lines, episode + 1, "created_at"
    if how == "kind":
        lines[episode]["kind"] = "memory"
        return lines, episode + 1, "kind must be one of"
    if how == "order":
        lines.insert(1, lines.pop(-2))  # a session line before the episodes
        return lines, 3, "after the session lines"
    if how == "version":
        lines[0]["version"] = 99
        return lines, 1, "format version 99"
    if how == "vector":
        lines[episode]["window_vectors"] = ["not base64!"] * len(lines[episode]["search_windows"])
        return lines, episode + 1, "not base64"
    if how == "windows":
        lines[episode]["search_windows"], lines[episode]["window_vectors"] = [[0, 5], [3, 10]], []
        return lines, episode + 1, "not those of whole messages"
    if how == "naive":
        lines[episode]["created_at"] = "2026-03-01T10:00:00"
        return lines, episode + 1, "timezone"
    if how == "calendar":  # aware, but not a time the store can hold in UTC
        lines[episode]["occurred_at"] = "0001-01-01T00:00:00+14:00"
        return lines, episode + 1, "outside the calendar"
    if how == "cut":
        return lines[:-1], len(lines), "cut short"
    if how == "counts":
        lines[-1]["lines"]["episodes"] += 1
        return lines, len(lines), "counts differ"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["field", "kind", "order", "version", "vector", "windows", "naive", "calendar", "cut", "counts"]
)
def test_a_bad_line_is_named_and_nothing_of_the_file_is_written(
    how: str, settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser, tmp_path: Path
) -> None:
    user = new_user("bad-file")
    remember(user, settings, store)
    lines, number, reason = damaged(export(client, user), how)
    client.forget_user(user)
    with pytest.raises(ImportRejected, match=reason) as refused:
        client.import_memory(write(tmp_path / "bad.jsonl", lines))
    assert refused.value.line == number and f"file: line {number}: " in str(refused.value)
    assert graph_facts(store, user)["episodes"] == 0
    assert store.export_counts(user) == {"episodes": 0, "entities": 0, "relationships": 0, "sessions": 0}


def test_not_json_or_not_utf8_is_named_too(client: MemoryClient, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"kind": "header"\n', encoding="utf-8")
    with pytest.raises(ImportRejected, match="line 1: not JSON"):
        client.import_memory(path)
    path.write_bytes(b'\n{"kind": "\xff"}\n')
    with pytest.raises(ImportRejected, match="line 2: not UTF-8"):
        client.import_memory(path)


def test_an_id_held_by_another_user_anywhere_in_the_file_refuses_the_import_before_any_write(
    settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser, tmp_path: Path
) -> None:
    user, squatter = new_user("owner"), new_user("squatter")
    remember(user, settings, store)
    lines = export(client, user)
    client.forget_user(user)
    last = [line for line in lines if line["kind"] == "episode"][-1]  # the last one saved: a later batch
    store.save_episode(record(squatter, "user: mine now", episode_id=last["id"]), entities("Zed"), [])
    with pytest.raises(QueryRejected, match=f"episode {last['id']} is stored for another user"):
        client.import_memory(write(tmp_path / "memory.jsonl", lines))
    assert store.export_counts(user) == {"episodes": 0, "entities": 0, "relationships": 0, "sessions": 0}


def test_vectors_of_another_embedding_model_are_left_out_and_an_erasure_during_an_import_stops_it(
    settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser, tmp_path: Path
) -> None:
    user = new_user("vectors")
    remember(user, settings, store)
    path = write(tmp_path / "memory.jsonl", export(client, user))
    client.forget_user(user)
    other_model = MemoryClient(settings.model_copy(update={"embedding_model": "openai/another-model"}))
    try:
        other_model.import_memory(path)
    finally:
        other_model.close()
    assert all(line.get("window_vectors", []) == [] for line in export(client, user))
    erased_at = time.time()
    store.mark_erased(user, erased_at, erasing_for_s=0.0)
    rows = [{"key": "k", "session_id": "s", "extracted": 1, "digest": "d", "hashes": None}]
    with pytest.raises(StoreRequestError) as refused:
        store.restore("session", user, rows, accepted_at=erased_at - 1)
    assert refused.value.cause == "ErasedDuringImport"


def test_every_kind_reads_the_same_rows_in_pages_of_one_as_in_one_page(
    settings: Settings, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    user, other = new_user("pages"), new_user("pages-other")
    remember(user, settings, store)
    remember(other, settings, store)
    for read in (store.export_episodes, store.export_entities, store.export_relationships, store.export_sessions):
        whole = list(read(user, page=10_000))
        assert whole and list(read(user, page=1)) == whole == list(read(user, page=2))
    assert all(row["episode"]["user_id"] == user for row in store.export_episodes(user, page=1))


def test_memctl_export_and_import_memory(
    settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser, tmp_path: Path
) -> None:
    user = new_user("memctl-export")
    remember(user, settings, store)
    out = tmp_path / "out.jsonl"
    done = memctl("export", "--user", user, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text().splitlines()[0])["counts"]["episodes"] == 6
    client.forget_user(user)
    imported = memctl("import-memory", str(out))
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["episodes_created"] == 6 and "import" in imported.stderr  # the bar
    bad = tmp_path / "bad.jsonl"
    bad.write_text(out.read_text().replace('"kind":"episode"', '"kind":"nonsense"', 1))
    refused = memctl("import-memory", str(bad))
    assert refused.returncode == 1 and "line 2: kind must be one of" in refused.stderr


def test_http_export_streams_json_lines(
    server: ServerProcess,  # noqa: F811
    settings: Settings,
    store: Neo4jGraphStore,
    client: MemoryClient,
    new_user: NewUser,
) -> None:
    user = new_user("http/export")  # a / in the id, sent as %2F
    remember(user, settings, store)
    path = "/v1/users/" + user.replace("/", "%2F") + "/memory/export"
    assert httpx.get(server.url + path, timeout=10).status_code == 401
    with httpx.stream("GET", server.url + path, headers=AUTH, timeout=30) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(text) for text in answer.iter_lines() if text]
    assert comparable(lines) == comparable(export(client, user))


def test_an_episode_saved_before_episodes_recorded_their_relationships_exports_an_equal_share(
    store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    user = new_user("legacy")
    old = record(user, "user: Ada and Bo", session_id="old")
    store.save_episode(old, entities("Ada", "Bo"), [relation("Ada", "Bo", 3.0, "knows")])
    store.save_episode(record(user, "user: Ada, Bo again"), entities("Ada", "Bo"), [relation("Ada", "Bo", 1.0)])
    with store._session() as s:  # as an earlier version stored it
        s.run(
            "MATCH (e:Episode {id: $id}) REMOVE e.rel_sources, e.rel_targets, e.rel_weights, e.rel_descriptions",
            id=old.id,
        ).consume()
    line = next(line for line in export(client, user) if line.get("id") == old.id)
    assert [
        {k: r[k] for k in ("source", "target", "predicate", "description", "weight")} for r in line["relationships"]
    ] == [{"source": "Ada", "target": "Bo", "predicate": "related_to", "description": "knows", "weight": 2.0}]


def test_a_session_forgotten_while_an_import_runs_does_not_get_its_progress_back(
    store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    user = new_user("forgot-mid-import")
    key = progress_key(user, "s")
    rows = [{"key": key, "session_id": "s", "extracted": 2, "digest": "d", "hashes": ["a", "b"]}]
    accepted = time.time()  # the import began
    client.forget_session(user, "s")  # then the session was forgotten
    assert store.restore("session", user, rows, accepted_at=accepted) == 0
    assert store.write_state(user, key, "none").line is None  # a later send of it is extracted again
    assert store.restore("session", user, rows, accepted_at=time.time()) == 1  # an import begun after: restored


def test_an_episode_dated_before_1970_is_exported(
    store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    """The export's page cursor started at 1970: an episode stored with an earlier time (an import accepts
    any) was counted in the header and never written, so a round trip lost it."""
    user = new_user("moon-landing")
    old = record(user, "user: we watched the landing").model_copy(
        update={"created_at": datetime(1969, 7, 20, tzinfo=UTC)}
    )
    store.save_episode(old, entities("Moon"), [])
    today = record(user, "user: today")
    store.save_episode(today, entities("Moon"), [])
    lines = export(client, user)
    assert [line["id"] for line in lines if line["kind"] == "episode"] == [old.id, today.id]
    assert lines[-1]["lines"]["episodes"] == 2
