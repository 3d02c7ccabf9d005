"""Re-extraction: a stored episode extracted again replaces exactly what its old extraction added (the other
episodes' counts untouched), a redelivered or replayed replacement changes nothing, and `memctl reextract`
goes through the queue with real workers and the stand-in model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from api_stub.client import MemoryClient
from api_stub.reextract import episode_of, messages_of
from tests.factories import entities, relation
from tests.ingest_helpers import graph_facts
from tests.llm_standin import Reply, StandIn, answer
from tests.test_forget_part import entity_rows, relation_rows
from tests.workers import WorkerProcess
from worker.errors import QueryRejected
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.models import Entity, EpisodeRecord, ExtractionKind, Limits, Relationship, build_episode
from worker.pipeline import episode_payload, extract_stage, persist_stage, reextract_stage
from worker.settings import Settings

NewUser = Callable[[str], str]


def stored(user: str, episode_id: str, content: str, extraction: ExtractionKind = "degraded") -> EpisodeRecord:
    return EpisodeRecord(
        id=episode_id,
        user_id=user,
        session_id="s",
        summary="old summary",
        content=content,
        extraction=extraction,
        model="old-model",
        prompt_version="extraction@v0",
        message_count=1,
    )


def again(store: Neo4jGraphStore, settings: Settings, user: str, job: str, episode_id: str) -> dict[str, Any]:
    """One re-extraction through both stages, in process; returns the persist payload and outcome."""
    row = next(r for r in store.episodes_to_reextract(user) if r["id"] == episode_id)
    payload = {**episode_payload(episode_of(row)), "reextract": job}
    extracted = reextract_stage(payload, settings=settings, store=store, llm=None)
    outcome = persist_stage(extracted, save=store.save_episode, replace=store.replace_extraction)
    return {"extracted": extracted, "outcome": outcome}


def labelled(rows: dict[Any, dict[str, Any]], ids: dict[str, str]) -> dict[Any, dict[str, Any]]:
    """Relation rows with their episode lists' ids replaced by labels (two users' ids differ)."""
    return {k: {**row, "episodes": [ids[i] for i in row["episodes"]]} for k, row in rows.items()}


def test_a_replacement_takes_back_exactly_the_old_extraction_and_a_redelivery_changes_nothing(
    settings: Settings, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    user = new_user("reextract")
    old = stored(user, f"{user}-a", "user: Ada Lovelace met Bo Chen in Porto.")
    store.save_episode(old, entities("Ada Lovelace", "Porto"), [relation("Ada Lovelace", "Porto", 5.0, "old words")])
    other = stored(user, f"{user}-b", "user: Ada Lovelace and Bo Chen again.", extraction="offline")
    other_write = (entities("Ada Lovelace", "Bo Chen"), [relation("Ada Lovelace", "Bo Chen", 1.0, "knows")])
    store.save_episode(other, *other_write)

    first = again(store, settings, user, "job-1", old.id)
    assert first["outcome"] == {"episode_id": old.id, "user_id": user, "status": "persisted", "created": True}
    after = (entity_rows(store, user), relation_rows(store, user), graph_facts(store, user))
    facts = after[2]
    assert facts["episodes"] == 2 and facts["mentions"] == facts["pairs"] == facts["counters"]
    # Exactly what a user gets who saved the new extraction, then the other (later) episode: the other's
    # descriptions stay the latest, and the episode lists keep the order the episodes were stored in.
    control = new_user("control")
    new = first["extracted"]
    store.save_episode(
        EpisodeRecord.model_validate(new["record"]).model_copy(
            update={"id": f"{control}-a", "user_id": control, "created_at": old.created_at}
        ),
        [Entity.model_validate(e) for e in new["entities"]],
        [Relationship.model_validate(r) for r in new["relationships"]],
    )
    store.save_episode(other.model_copy(update={"id": f"{control}-b", "user_id": control}), *other_write)
    assert after[0] == entity_rows(store, control) and "Porto" in after[0]
    assert after[0]["Ada Lovelace"]["description"] == "about Ada Lovelace"  # the later episode's
    ours = {old.id: "a", other.id: "b"}
    theirs = {f"{control}-a": "a", f"{control}-b": "b"}
    assert labelled(after[1], ours) == labelled(relation_rows(store, control), theirs)
    assert all(r["description"] != "old words" for r in after[1].values())
    episode = next(r for r in store.episodes_to_reextract(user) if r["id"] == old.id)
    assert episode["extraction"] == "offline" and episode["content"] == old.content

    redelivered = persist_stage(first["extracted"], save=store.save_episode, replace=store.replace_extraction)
    assert redelivered["status"] == "persisted" and redelivered["created"] is False
    assert (entity_rows(store, user), relation_rows(store, user), graph_facts(store, user)) == after

    second = again(store, settings, user, "job-2", old.id)  # the same model again: the same memory
    assert second["outcome"]["created"] is True
    assert (entity_rows(store, user), relation_rows(store, user), graph_facts(store, user)) == after
    replayed = persist_stage(first["extracted"], save=store.save_episode, replace=store.replace_extraction)
    assert replayed["created"] is False  # an earlier run's replay never undoes a later one


def test_a_forgotten_episode_is_not_extracted_again_nor_written_back(
    standin: StandIn,
    llm_settings: Settings,
    settings: Settings,
    store: Neo4jGraphStore,
    client: MemoryClient,
    new_user: NewUser,
) -> None:
    user = new_user("reextract-gone")
    old = stored(user, f"{user}-a", "user: Ada met Bo.")
    store.save_episode(old, entities("Ada"), [])
    row = next(iter(store.episodes_to_reextract(user)))
    payload = {**episode_payload(episode_of(row)), "reextract": "job"}
    extracted = reextract_stage(payload, settings=settings, store=store, llm=None)  # offline: before the forget
    client.forget_episode(user, old.id)
    assert reextract_stage(payload, settings=llm_settings, store=store, llm=None)["status"] == "forgotten"
    assert standin.calls == 0  # no model call for it
    persisted = persist_stage(extracted, save=store.save_episode, replace=store.replace_extraction)
    assert persisted["status"] == "forgotten" and graph_facts(store, user)["episodes"] == 0


def test_stored_content_gives_back_the_messages() -> None:
    messages = messages_of("user: I live in Porto\nassistant: Nice: sunny\nuser: yes")
    assert [(m.role, m.content) for m in messages] == [
        ("user", "I live in Porto"),
        ("assistant", "Nice: sunny"),
        ("user", "yes"),
    ]
    assert [(m.role, m.content) for m in messages_of("Dear diary: today")] == [("user", "Dear diary: today")]
    assert [(m.role, m.content) for m in messages_of("Notes first\nuser: then this")] == [
        ("user", "Notes first"),
        ("user", "then this"),
    ]


def test_a_degraded_answer_never_replaces_a_real_extraction(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    user = new_user("reextract-degraded")
    old = stored(user, f"{user}-a", "user: Ada met Bo in Porto.", extraction="llm")
    store.save_episode(old, entities("Ada", "Bo"), [relation("Ada", "Bo", 1.0, "met")])
    before = (entity_rows(store, user), relation_rows(store, user), graph_facts(store, user))
    standin.default = lambda _request: Reply(content="not JSON at all")  # the answer and its re-ask
    row = next(iter(store.episodes_to_reextract(user)))
    payload = {**episode_payload(episode_of(row)), "reextract": "job"}
    extracted = reextract_stage(payload, settings=llm_settings, store=store, llm=None)
    assert extracted["record"]["extraction"] == "degraded" and standin.calls == 2
    outcome = persist_stage(extracted, save=store.save_episode, replace=store.replace_extraction)
    assert outcome["created"] is False
    assert (entity_rows(store, user), relation_rows(store, user), graph_facts(store, user)) == before
    kept = next(iter(store.episodes_to_reextract(user)))
    assert kept["extraction"] == "llm"


def test_memctl_reextract_only_degraded_with_the_model_through_workers(
    standin: StandIn,
    llm_settings: Settings,
    store: Neo4jGraphStore,
    workers: Callable[..., WorkerProcess],
    new_user: NewUser,
    clean_redis: Any,
) -> None:
    user = new_user("reextract-llm")
    env = {"MEMORY_LLM_MODEL": "openai/stand-in", "MEMORY_LLM_API_BASE": standin.url, "MEMORY_LLM_API_KEY": "sk-x"}
    workers(**env)
    client = MemoryClient(llm_settings)
    try:
        standin.default = lambda _request: Reply(content="this is not JSON")
        bad = client.add_episode(user, "s1", [{"role": "user", "content": "My sister Ada lives in Porto."}])
        assert client.wait([bad], timeout_s=60)[0].state == "persisted"  # degraded: bad answer, bad re-ask
        good_answer = {"summary": "sister in Porto", "entities": [{"name": "Ada"}, {"name": "Bo"}]}
        standin.default = lambda _request: answer(good_answer)
        fine = client.add_episode(user, "s2", [{"role": "user", "content": "Bo is my brother."}])
        assert client.wait([fine], timeout_s=60)[0].state == "persisted"
        kinds = {r["id"]: r["extraction"] for r in store.episodes_to_reextract(user)}
        assert sorted(kinds.values()) == ["degraded", "llm"]
        before_calls = standin.calls

        plan = client.reextract_plan(user, only_degraded=True)
        assert (plan.episodes, plan.llm_calls, plan.without_content) == (1, 1, 0)
        assert plan.prompt_tokens > 50 and plan.completion_tokens_estimated > 0 and plan.model == "openai/stand-in"
        assert standin.calls == before_calls  # a dry run calls no model

        standin.default = lambda _request: answer(
            {
                "summary": "Ada, sister, in Porto",
                "entities": [{"name": "Ada"}, {"name": "Porto", "type": "place"}],
                "relationships": [{"source": "Ada", "target": "Porto", "description": "lives in"}],
            }
        )
        done = subprocess.run(
            [sys.executable, "-m", "api_stub.cli", "reextract", "--user", user, "--only-degraded"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert '"enqueued":1' in done.stdout.replace(" ", "")
        assert _wait_for(lambda: sorted(r["extraction"] for r in store.episodes_to_reextract(user)) == ["llm"] * 2)
        assert standin.calls == before_calls + 1  # only the degraded one went to the model
        rows = entity_rows(store, user)
        assert rows["Ada"]["mentions"] == 2 and rows["Porto"]["mentions"] == 1 and rows["Bo"]["mentions"] == 1
        facts = graph_facts(store, user)
        assert facts["mentions"] == facts["pairs"] == facts["counters"]
        assert relation_rows(store, user)[("Ada", "Porto")]["description"] == "lives in"
    finally:
        client.close()


def _wait_for(condition: Callable[[], bool], timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def test_reextract_refuses_when_no_chosen_episode_kept_its_content_and_a_bad_version(
    store: Neo4jGraphStore, client: MemoryClient, new_user: NewUser
) -> None:
    user = new_user("reextract-no-content")
    store.save_episode(stored(user, f"{user}-a", "x").model_copy(update={"content": None}), entities("Ada"), [])
    with pytest.raises(QueryRejected, match="without content"):
        client.reextract(user)
    assert client.reextract_plan(user).without_content == 1
    with pytest.raises(QueryRejected, match="extraction@v2"):
        client.reextract_plan(user, older_than="latest")
    assert client.reextract_plan(user, older_than="extraction@v1").without_content == 1
    assert client.reextract_plan(user, older_than="extraction@v0").without_content == 0


def test_memctl_reextract_all_dry_run_and_usage(store: Neo4jGraphStore, new_user: NewUser) -> None:
    user = new_user("reextract-all")
    store.save_episode(stored(user, f"{user}-a", "user: Ada met Bo."), entities("Ada"), [])
    done = subprocess.run(
        [sys.executable, "-m", "api_stub.cli", "reextract", "--all", "--only-degraded", "--dry-run"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["episodes"] >= 1 and plan["llm_calls"] == 0 and plan["estimated_cost_usd"] == 0.0  # offline
    assert {e["id"] for e in store.episodes_to_reextract(None) if e["user_id"] == user} == {f"{user}-a"}
    for args in ([], ["--user", user, "--all"]):
        usage = subprocess.run(
            [sys.executable, "-m", "api_stub.cli", "reextract", *args], capture_output=True, text=True, timeout=60
        )
        assert usage.returncode == 2 and "give --user U or --all" in usage.stderr


def fact_times(store: Neo4jGraphStore, user: str) -> dict[tuple[str, str], Any]:
    with store._session() as s:
        rows = s.run(
            "MATCH (a:Entity {user_id: $u})-[r:RELATED_TO]->(b) RETURN a.name AS a, b.name AS b, r.valid_from AS at",
            u=user,
        )
        return {(r["a"], r["b"]): r["at"].to_native() for r in rows}


MARCH = datetime(2026, 3, 10, 9, 30, tzinfo=UTC)


def test_facts_a_reextraction_finds_in_an_undated_episode_are_valid_from_when_it_was_stored(
    settings: Settings, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    """Issue 33 item 2: the episode was stored in March with no facts; a new model finds one today. The fact
    held from March (the episode's time), not from the day `memctl reextract` ran."""
    user = new_user("reextract-dates")
    old = stored(user, f"{user}-a", "user: Ada Lovelace met Bo Chen in Porto.").model_copy(update={"created_at": MARCH})
    store.save_episode(old, [], [])
    assert again(store, settings, user, "job-dates", old.id)["outcome"]["status"] == "persisted"
    times = fact_times(store, user)
    assert times and set(times.values()) == {MARCH}, times


def test_facts_of_an_undated_episode_are_valid_from_when_it_was_accepted_not_when_a_backlog_got_to_it(
    settings: Settings, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    """Issue 33 item 2, the normal path: an undated send accepted in March and extracted only now (a backlog,
    a dead-letter replay) dates its facts at its acceptance."""
    user = new_user("accepted-dates")
    messages = [{"role": "user", "content": "Ada Lovelace met Bo Chen in Porto."}]
    episode = build_episode(user, "s", messages, limits=Limits())
    payload = extract_stage(
        episode_payload(episode, accepted_at=MARCH.timestamp()), settings=settings, store=store, llm=None
    )
    assert persist_stage(payload, save=store.save_episode)["status"] == "persisted"
    times = fact_times(store, user)
    assert times and set(times.values()) == {MARCH}, times
