"""Facts that change over time: the user's current facts are offered to the one extraction call with ids,
the answer's `ends` marks them ended (never deleted), recall puts current facts first and marks the ended
ones, and answers as of a time. The stand-in answers as a model would: it reads the known facts it is given."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from api_stub.client import MemoryClient
from tests.factories import entities, record
from tests.llm_standin import Reply, StandIn, answer
from tests.servers import ServerProcess
from tests.test_http import AUTH, server  # noqa: F401  (the fixture)
from tests.test_policy_and_dlq import memctl
from tests.test_portability import comparable, export, write
from tests.workers import WorkerProcess
from worker.deadletter import DeadLetterStore
from worker.facts_text import fact_date, normalize_predicate
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.known_facts import KnownFact, ended_facts
from worker.models import (
    Entity,
    EpisodeRecord,
    ExtractionResult,
    Limits,
    MemoryContext,
    Relationship,
    build_episode,
)
from worker.pipeline import episode_payload, extract_stage, persist_stage
from worker.settings import Settings

NewUser = Callable[[str], str]
CITIES = ("Porto", "Lisbon")
MARCH, APRIL, JUNE, AUGUST = (datetime(2026, m, 10, tzinfo=UTC) for m in (3, 4, 6, 8))
SAID = {
    "Porto": [{"role": "user", "content": "I live in Porto, in a flat near the river."}],
    "Lisbon": [{"role": "user", "content": "Big news: we moved to Lisbon last week."}],
}


def model_that_ends(invent: bool = False) -> Callable[[dict[str, Any]], Reply]:
    """user lives_in <the city the new messages name>; ends the known lives_in facts of other cities (or, with
    `invent`, only ids that were never offered)."""

    def reply(request: dict[str, Any]) -> Reply:
        text = request["messages"][-1]["content"]
        new = text.split("New messages:")[-1]
        city = next(c for c in CITIES if c in new)
        offered = dict(re.findall(r"^(f\d+): user lives_in (\w+)", text, re.M))
        ends = ["f99"] if invent else [fid for fid, known in offered.items() if known != city]
        return answer(
            {
                "summary": f"The user lives in {city}.",
                "entities": [
                    {"name": "user", "type": "person", "description": ""},
                    {"name": city, "type": "place", "description": "where the user lives"},
                ],
                "relationships": [
                    {
                        "source": "user",
                        "target": city,
                        "predicate": "Lives in",
                        "description": "lives in",
                        "weight": 1.0,
                        "valid_from": "",
                        "ends": ends,
                    }
                ],
                "ends": ["f42"] if invent else [],
            }
        )

    return reply


def facts(store: Neo4jGraphStore, user: str) -> dict[str, dict[str, Any]]:
    """target name → the fact user -[predicate]-> target, as stored."""
    with store._session() as s:
        rows = s.run(
            """
            MATCH (a:Entity {user_id: $u})-[r:RELATED_TO]->(b:Entity)
            RETURN b.name AS target, r {.predicate, .weight, .support, .valid_from, .invalid_from, .ended_by,
                                        .replaces, .episodes, .reopened_by, .before_valid_from,
                                        .before_invalid_from, .before_ended_by} AS fact
            """,
            u=user,
        )
        return {r["target"]: {k: v for k, v in r["fact"].items()} for r in rows}


def relations(context: MemoryContext) -> list[tuple[str, str, bool]]:
    return [(r.target, r.predicate, r.current) for r in context.related_relations]


def test_a_move_ends_the_old_home_through_the_workers_and_recall_answers_now_and_as_of_april(
    standin: StandIn,
    store: Neo4jGraphStore,
    workers: Callable[..., WorkerProcess],
    new_user: NewUser,
    clean_redis: Any,
) -> None:
    standin.default = model_that_ends()
    env = {"MEMORY_LLM_MODEL": "openai/stand-in", "MEMORY_LLM_API_BASE": standin.url, "MEMORY_LLM_API_KEY": "sk-x"}
    workers(**env)
    user = new_user("moves")
    client = MemoryClient(Settings.load(**{"llm_model": "openai/stand-in", "llm_api_base": standin.url}))
    try:
        porto = client.add_episode(user, "march", SAID["Porto"], occurred_at=MARCH)
        assert [s.state for s in client.wait([porto], timeout_s=60)] == ["persisted"]
        lisbon = client.add_episode(user, "june", SAID["Lisbon"], occurred_at=JUNE)
        assert [s.state for s in client.wait([lisbon], timeout_s=60)] == ["persisted"]
        assert "Known facts" not in standin.requests[0]["messages"][-1]["content"]  # nothing known yet
        offered = standin.requests[1]["messages"][-1]["content"]
        assert re.search(r"^f1: user lives_in Porto \(since 2026-03-10\)$", offered, re.M), offered

        stored = facts(store, user)
        assert stored["Porto"]["predicate"] == stored["Lisbon"]["predicate"] == "lives_in"
        assert stored["Porto"]["invalid_from"].to_native() == JUNE and stored["Porto"]["ended_by"] == lisbon.episode_id
        assert stored["Lisbon"]["invalid_from"] is None and stored["Lisbon"]["valid_from"].to_native() == JUNE
        assert stored["Lisbon"]["replaces"] == [json.dumps(["user", "lives_in", "porto"])]

        now = client.retrieve_memory(user, "where do I live")
        assert relations(now) == [("Lisbon", "lives_in", True), ("Porto", "lives_in", False)]
        ended = now.related_relations[1]
        assert ended.valid_from == MARCH and ended.invalid_from == JUNE
        april = client.retrieve_memory(user, "where do I live", as_of=APRIL)
        assert relations(april) == [("Porto", "lives_in", True)]
        assert "Lisbon" not in [e.name for e in april.related_entities]  # not even as a neighbour
        assert [e.id for e in april.related_episodes] == [porto.episode_id]

        # Sent again: unchanged, and the graph with it.
        again = [
            client.add_episode(user, s, SAID[c], occurred_at=t)
            for s, c, t in (("march", "Porto", MARCH), ("june", "Lisbon", JUNE))
        ]
        assert [s.state for s in client.wait(again, timeout_s=60)] == ["unchanged", "unchanged"]
        assert facts(store, user) == stored
    finally:
        client.close()
    assert DeadLetterStore(clean_redis).count() == 0


def extracted(
    user: str,
    city: str,
    when: datetime,
    settings: Settings,
    store: Neo4jGraphStore,
    said: str | None = None,
    session: str | None = None,
    episode_id: str | None = None,
) -> dict[str, Any]:
    messages = [{"role": "user", "content": said}] if said else SAID[city]
    session_id = session or when.isoformat()
    episode = build_episode(user, session_id, messages, limits=Limits(), occurred_at=when, episode_id=episode_id)
    return extract_stage(episode_payload(episode), settings=settings, store=store, llm=None)


def persisted(payload: dict[str, Any], store: Neo4jGraphStore) -> str:
    return str(persist_stage(payload, save=store.save_episode)["status"])


def test_replaying_either_episode_changes_nothing_and_forgetting_the_move_opens_the_old_home_again(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-replay")
    porto, lisbon = told(user, llm_settings, store, MOVE)
    stored = facts(store, user)
    assert stored["Porto"]["invalid_from"] is not None
    for payload in (lisbon, porto, lisbon):  # a redelivered persist message, a replayed dead letter
        assert persisted(payload, store) in ("persisted", "unchanged")  # the same send: stored already
        assert facts(store, user) == stored

    client.forget_episode(user, lisbon["episode_id"])
    reopened = facts(store, user)
    assert set(reopened) == {"Porto"}
    assert (reopened["Porto"]["invalid_from"], reopened["Porto"]["ended_by"]) == (None, None)
    assert relations(client.retrieve_memory(user, "where do I live")) == [("Porto", "lives_in", True)]


def test_http_and_memctl_answer_as_of_a_time_and_refuse_one_without_a_zone(
    server: ServerProcess,  # noqa: F811
    standin: StandIn,
    llm_settings: Settings,
    store: Neo4jGraphStore,
    new_user: NewUser,
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-as-of")
    told(user, llm_settings, store, MOVE)

    def over_http(as_of: str | None) -> httpx.Response:
        body = {"user_id": user, "query": "where do I live", "as_of": as_of}
        return httpx.post(server.url + "/v1/recall", json=body, headers=AUTH, timeout=10)

    april = over_http("2026-04-10T00:00:00+00:00")
    assert [(r["target"], r["current"]) for r in april.json()["related_relations"]] == [("Porto", True)]
    now = over_http(None).json()["related_relations"]
    assert [(r["target"], r["current"], r["invalid_from"]) for r in now] == [
        ("Lisbon", True, None),
        ("Porto", False, "2026-06-10T00:00:00Z"),
    ]
    naive = over_http("2026-04-10T00:00:00")
    assert naive.status_code in (400, 422) and "as_of" in naive.text

    cli = memctl("recall", "--user", user, "--as-of", "2026-04-10", "--json", "where do I live")
    assert cli.returncode == 0, cli.stderr
    assert [(r["target"], r["current"]) for r in json.loads(cli.stdout)["related_relations"]] == [("Porto", True)]
    text = memctl("recall", "--user", user, "where do I live")
    assert "-[lives_in 1]-> Porto since 2026-03-10  (ended 2026-06-10)" in text.stdout, text.stdout
    bad = memctl("recall", "--user", user, "--as-of", "April", "where do I live")
    assert bad.returncode == 2 and "--as-of" in bad.stderr


def test_ids_the_model_invents_end_nothing(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    standin.default = model_that_ends(invent=True)
    user = new_user("moves-invented")
    assert persisted(extracted(user, "Porto", MARCH, llm_settings, store), store) == "persisted"
    lisbon = extracted(user, "Lisbon", JUNE, llm_settings, store)
    assert "f1: user lives_in Porto" in standin.requests[-1]["messages"][-1]["content"]  # offered, not ended
    assert lisbon["record"]["ended_facts"] == []
    assert persisted(lisbon, store) == "persisted"
    assert all(f["invalid_from"] is None for f in facts(store, user).values())


def test_back_in_the_old_home_makes_it_current_again_and_a_reextraction_keeps_what_ended(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-back")
    porto, _ = told(user, llm_settings, store, MOVE)
    ended = facts(store, user)["Porto"]
    assert ended["invalid_from"].to_native() == JUNE

    # A re-extraction of the Porto episode says Porto again: every fact stays as it was (Porto, only this
    # episode's, is deleted and added again: it keeps its times and end, and Lisbon still lists it replaced).
    before = facts(store, user)
    assert before["Lisbon"]["replaces"] == [json.dumps(["user", "lives_in", "porto"])]
    assert reextracted(store, porto) == "created"
    assert facts(store, user) == before
    again = before["Porto"]

    facts_before_back = facts(store, user)
    back = extracted(user, "Porto", AUGUST, llm_settings, store, said="We are back in Porto for good.")
    assert "f1: user lives_in Lisbon" in standin.requests[-1]["messages"][-1]["content"]
    assert persisted(back, store) == "persisted"
    now = facts(store, user)
    assert (now["Porto"]["invalid_from"], now["Porto"]["valid_from"].to_native()) == (None, AUGUST)
    assert now["Lisbon"]["invalid_from"].to_native() == AUGUST
    assert now["Porto"]["replaces"] == [json.dumps(["user", "lives_in", "lisbon"])]
    assert relations(client.retrieve_memory(user, "where do I live")) == [
        ("Porto", "lives_in", True),
        ("Lisbon", "lives_in", False),
    ]

    assert (now["Porto"]["before_invalid_from"].to_native(), now["Porto"]["reopened_by"]) == (JUNE, back["episode_id"])

    # Forgetting the way back puts both as they were before it: Porto ended in June, Lisbon current.
    client.forget_episode(user, back["episode_id"])
    assert facts(store, user) == {"Porto": again, "Lisbon": facts_before_back["Lisbon"]}


def reextracted(store: Neo4jGraphStore, payload: dict[str, Any], keep_relationships: bool = True) -> str:
    """The stored episode re-extracted with the same answer (or, without keep_relationships, with none)."""
    record = EpisodeRecord.model_validate(payload["record"]).model_copy(update={"accepted_at": time.time()})
    ents = [Entity.model_validate(e) for e in payload["entities"]]
    rels = [Relationship.model_validate(r) for r in payload["relationships"]] if keep_relationships else []
    return store.replace_extraction(record, ents, rels, f"job-{time.time()}").outcome


Step = tuple[str, datetime, str | None, str | None]  # city, when, what was said (default: SAID), session
MOVE: list[Step] = [("Porto", MARCH, None, None), ("Lisbon", JUNE, None, None)]
AND_BACK: list[Step] = [*MOVE, ("Porto", AUGUST, "Back in Porto.", None)]


def told(user: str, settings: Settings, store: Neo4jGraphStore, steps: list[Step]) -> list[dict[str, Any]]:
    """Each step extracted (offered what the earlier ones left) and persisted in turn: their persist payloads.
    MOVE: Porto (March), then Lisbon (June, ends Porto); AND_BACK: then back in Porto (August, ends Lisbon)."""
    payloads = []
    for city, when, said, session in steps:
        payload = extracted(user, city, when, settings, store, said, session=session)
        assert persisted(payload, store) == "persisted"
        payloads.append(payload)
    return payloads


def test_as_of_inside_the_earlier_period_of_a_fact_made_current_again(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-periods")
    told(user, llm_settings, store, AND_BACK)
    april = client.retrieve_memory(user, "where do I live", as_of=APRIL)
    assert [(r.target, r.current, r.valid_from, r.invalid_from) for r in april.related_relations] == [
        ("Porto", True, MARCH, JUNE)
    ]
    july = client.retrieve_memory(user, "where do I live", as_of=datetime(2026, 7, 10, tzinfo=UTC))
    assert [(r.target, r.current) for r in july.related_relations] == [("Lisbon", True), ("Porto", False)]
    # "last month" as of July is June: the move's episode, found by its time
    june = client.retrieve_memory(user, "what happened last month", as_of=datetime(2026, 7, 10, tzinfo=UTC))
    assert [("Lisbon" in e.summary, "time" in e.matched_by) for e in june.related_episodes] == [(True, True)]


def test_as_of_gives_only_the_entities_of_the_episodes_it_returns(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-as-of-limit")
    told(user, llm_settings, store, AND_BACK)
    one = client.retrieve_memory(user, "where do I live", limit=1, as_of=datetime(2026, 9, 10, tzinfo=UTC))
    [episode] = one.related_episodes
    city = next(c for c in CITIES if c in episode.summary)
    assert {e.name for e in one.related_entities if e.hop == 0} == {"user", city}


def test_forgetting_the_move_after_the_way_back_then_the_way_back_leaves_porto_current_and_no_trace(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-forget-middle")
    _, lisbon, back = (str(p["episode_id"]) for p in told(user, llm_settings, store, AND_BACK))
    client.forget_episode(user, lisbon)
    porto = facts(store, user)["Porto"]  # never ended: it holds since March, and nothing was reopened
    assert (porto["valid_from"].to_native(), porto["reopened_by"], porto["replaces"]) == (MARCH, None, None)
    assert (porto["before_valid_from"], porto["before_invalid_from"], porto["before_ended_by"]) == (None, None, None)
    client.forget_episode(user, back)
    porto = facts(store, user)["Porto"]
    assert (porto["valid_from"].to_native(), porto["invalid_from"], porto["ended_by"]) == (MARCH, None, None)
    assert all(porto[k] is None for k in ("reopened_by", "before_valid_from", "before_invalid_from"))


def test_a_reextraction_that_no_longer_says_the_way_back_undoes_the_reopening(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-reextract-drop")
    back = told(user, llm_settings, store, AND_BACK)[2]
    assert reextracted(store, back, keep_relationships=False) == "created"
    stored = facts(store, user)
    porto = stored["Porto"]  # still said by the March episode, ended in June again; Lisbon stays ended
    assert (porto["invalid_from"].to_native(), porto["reopened_by"], porto["replaces"]) == (JUNE, None, None)
    assert stored["Lisbon"]["invalid_from"].to_native() == AUGUST


def test_forgetting_a_session_undoes_the_way_back_before_it_opens_what_the_move_ended(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-session")
    told(user, llm_settings, store, [MOVE[0], *((c, w, t, "travels") for c, w, t, _ in AND_BACK[1:])])
    client.forget_session(user, "travels")
    assert set(facts(store, user)) == {"Porto"}
    kept = facts(store, user)["Porto"]
    assert (kept["valid_from"].to_native(), kept["invalid_from"], kept["ended_by"], kept["reopened_by"]) == (
        MARCH,
        None,
        None,
        None,
    )


def test_two_ways_back_saved_in_one_batch_apply_in_time_order_and_a_deleted_fact_leaves_no_replaces(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-batch")
    first, _ = told(user, llm_settings, store, MOVE)
    september = datetime(2026, 9, 10, tzinfo=UTC)
    ways_back = [  # the later one first by id: the batch must order them by time, not by id
        extracted(
            user, "Porto", when, llm_settings, store, said=f"Back in Porto ({when:%B}).", episode_id=f"{user}-{i}"
        )
        for i, when in enumerate((september, AUGUST))
    ]
    writes = [
        (
            EpisodeRecord.model_validate(p["record"]),
            [Entity.model_validate(e) for e in p["entities"]],
            [Relationship.model_validate(r) for r in p["relationships"]],
        )
        for p in ways_back
    ]
    assert [r.outcome for r in store.save_episodes(writes)] == ["created", "created"]
    stored = facts(store, user)
    august_id = ways_back[1]["episode_id"]
    assert (stored["Porto"]["valid_from"].to_native(), stored["Porto"]["reopened_by"]) == (AUGUST, august_id)
    assert (stored["Lisbon"]["invalid_from"].to_native(), stored["Lisbon"]["ended_by"]) == (AUGUST, august_id)
    assert stored["Porto"]["replaces"] == [json.dumps(["user", "lives_in", "lisbon"])]

    client.forget_episode(user, first["episode_id"])  # Porto stays (the ways back support it)
    client.forget_episode(user, ways_back[0]["episode_id"])
    client.forget_episode(user, august_id)  # Porto goes: Lisbon no longer lists it as replaced
    assert set(facts(store, user)) == {"Lisbon"} and facts(store, user)["Lisbon"]["replaces"] is None


def test_forgetting_an_episode_whose_end_did_not_apply_keeps_the_replacement_that_did(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-twice")
    told(user, llm_settings, store, MOVE[:1])
    july = datetime(2026, 7, 10, tzinfo=UTC)
    both = [
        extracted(user, "Lisbon", when, llm_settings, store, f"We moved to Lisbon ({when:%B}).")
        for when in (JUNE, july)
    ]
    for payload in both:  # both were offered Porto; the July end finds it ended already
        assert persisted(payload, store) == "persisted"
    stored = facts(store, user)
    assert (stored["Porto"]["ended_by"], stored["Lisbon"]["replaces"]) == (
        both[0]["episode_id"],
        [json.dumps(["user", "lives_in", "porto"])],
    )
    client.forget_episode(user, both[1]["episode_id"])
    after = facts(store, user)
    assert (after["Porto"]["ended_by"], after["Lisbon"]["replaces"]) == (
        both[0]["episode_id"],
        [json.dumps(["user", "lives_in", "porto"])],
    )


def test_the_offline_extractor_reads_no_facts_and_ends_none(
    settings: Settings, store: Neo4jGraphStore, new_user: NewUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = new_user("moves-offline")
    reads: list[str] = []

    def counted(user_id: str, text: str, limit: int) -> list[dict[str, Any]]:
        reads.append(user_id)
        return []

    monkeypatch.setattr(store, "current_facts", counted)
    told(user, settings, store, MOVE)
    assert reads == []
    with store._session() as s:
        ended = s.run(
            "MATCH (:Entity {user_id: $u})-[r:RELATED_TO]->() WHERE r.invalid_from IS NOT NULL RETURN count(r) AS n",
            u=user,
        ).single(strict=True)["n"]
    assert ended == 0


def test_export_and_import_keep_predicates_times_and_what_ended_what(
    standin: StandIn,
    llm_settings: Settings,
    store: Neo4jGraphStore,
    client: MemoryClient,
    new_user: NewUser,
    tmp_path: Path,
) -> None:
    standin.default = model_that_ends()
    user = new_user("moves-export")
    told(user, llm_settings, store, AND_BACK)
    before = export(client, user)
    assert before[0]["version"] == 2
    porto = next(line for line in before if line["kind"] == "relationship" and line["target"] == "Porto")
    assert (porto["predicate"], porto["invalid_from"], porto["valid_from"]) == (
        "lives_in",
        None,
        "2026-08-10T00:00:00Z",
    )
    assert (porto["before_invalid_from"], porto["reopened_by"] is not None) == ("2026-06-10T00:00:00Z", True)
    recalled = client.retrieve_memory(user, "where do I live")
    client.forget_user(user)
    client.import_memory(write(tmp_path / "moves.jsonl", before))
    assert comparable(export(client, user)) == comparable(before)
    assert relations(client.retrieve_memory(user, "where do I live")) == relations(recalled)
    # Forgetting the way back after the import puts Porto back as ended in June, Lisbon current.
    client.forget_episode(user, porto["reopened_by"])
    after = facts(store, user)
    assert after["Porto"]["invalid_from"].to_native() == JUNE and after["Lisbon"]["invalid_from"] is None


def test_relationships_stored_before_predicates_get_the_default_and_merge_with_new_saves(
    store: Neo4jGraphStore, new_user: NewUser
) -> None:
    user = new_user("legacy-predicates")
    ada_bo = [Relationship(source="Ada", target="Bo", weight=1.0)]
    store.save_episode(record(user, "user: Ada and Bo"), entities("Ada", "Bo"), ada_bo)
    with store._session() as s:  # as an earlier version stored it, before the upgrade ran
        s.run("MATCH (:Entity {user_id: $u})-[r:RELATED_TO]->() REMOVE r.predicate", u=user).consume()
        s.run("MATCH (m:SchemaMark {name: 'relationship_predicates'}) DELETE m").consume()
    store.upgrade_predicates()
    store.save_episode(record(user, "user: Ada and Bo again"), entities("Ada", "Bo"), ada_bo)
    stored = facts(store, user)
    assert list(stored) == ["Bo"] and (stored["Bo"]["predicate"], stored["Bo"]["support"]) == ("related_to", 2)


def test_predicates_and_dates_are_normalised_and_only_offered_ids_end_facts() -> None:
    assert [normalize_predicate(p) for p in ("Lives in", "LIVES_IN", " works-at ", "", "!!", "位于")] == [
        "lives_in",
        "lives_in",
        "works_at",
        "related_to",
        "related_to",
        "位于",
    ]
    assert [fact_date(d) for d in ("2024-06-03", "2024-06", "2024", "2024-02-30", "soon", "")] == [
        "2024-06-03",
        "2024-06-01",
        "2024-01-01",
        "",
        "",
        "",
    ]
    offered = [KnownFact("f1", "user", "user", "lives_in", "porto", "Porto", MARCH)]
    moved = Relationship(source="User", target="Lisbon", predicate="lives_in", valid_from="2026-06", ends=["f1", "f7"])
    again = Relationship(source="user", target="PORTO", predicate="lives in", ends=["f1"])  # ends itself: no
    ends = ended_facts(ExtractionResult(summary="s", relationships=[moved], ends=["f1", "f9"]), offered)
    assert [(e.source_key, e.predicate, e.target_key, e.at, e.replaced_by) for e in ends] == [
        ("user", "lives_in", "porto", datetime(2026, 6, 1, tzinfo=UTC), ("user", "lives_in", "lisbon"))
    ]
    assert ended_facts(ExtractionResult(summary="s", relationships=[again]), offered) == ()
    bare = ended_facts(ExtractionResult(summary="s", ends=[" f1 ", "f2"]), offered)  # no replacement
    assert [(e.target_key, e.at, e.replaced_by) for e in bare] == [("porto", None, ())]
