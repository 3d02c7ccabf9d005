"""retrieve_memory and forget_user through MemoryClient against real Neo4j and Redis."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from api_stub.client import MemoryClient
from api_stub.recall import check_user_id
from tests.factories import entities, record, relation
from tests.services import RedisClient
from worker.deadletter import DeadLetterStore
from worker.errors import EpisodeRejected, QueryRejected, StoreUnavailable
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.identity import user_tag
from worker.keys import keywords_cache, keywords_cache_pattern

NewUser = Callable[[str], str]
CRAFTED = [
    "*",
    "?*",
    '"lisbon"',
    "lisbon AND OR NOT",
    "user_id:someone-else",
    "}) RETURN e //",
    "' OR 1=1 --",
    "back\\slash \\",
    "x" * 5000,  # long but under MEMORY_MAX_QUERY_CHARS (8000)
]


def seed(store: Neo4jGraphStore, user: str, other: str) -> str:
    mine = record(user, "Anna moved to Lisbon and works at Acme", summary="Anna moved to Lisbon")
    store.save_episode(mine, entities("Anna", "Lisbon", "Acme"), [relation("Anna", "Lisbon", 0.8, "lives in")])
    store.save_episode(record(user, "I bought a new laptop"), entities("Laptop"), [])
    store.save_episode(record(other, "Anna from Lisbon is my secret"), entities("Anna", "Lisbon"), [])
    return mine.id


def test_recall_returns_the_users_episode_with_entities_and_relations(
    client: MemoryClient, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    user, other = new_user("me"), new_user("other")
    wanted = seed(store, user, other)
    # The first recall of a fresh client may meet a Neo4j restarted by an earlier test (queries planned
    # again): this test is about what comes back, so it gives that one call room.
    context = client.retrieve_memory(user, "Where does Anna live now?", budget_ms=20_000)
    assert not context.degraded
    assert context.related_episodes[0].id == wanted
    assert {e.user_id for e in context.related_episodes} == {user}
    assert {e.name for e in context.related_entities} >= {"Anna", "Lisbon"}
    assert [(r.source, r.target) for r in context.related_relations] == [("Anna", "Lisbon")]
    assert len(client.retrieve_memory(user, "Anna laptop Lisbon", limit=1).related_episodes) == 1


@pytest.mark.parametrize("query", CRAFTED)
def test_crafted_queries_never_fail_and_never_leak(
    client: MemoryClient, store: Neo4jGraphStore, new_user: NewUser, query: str
) -> None:
    user, other = new_user("me"), new_user("other")
    seed(store, user, other)
    context = client.retrieve_memory(user, query)
    assert not context.degraded
    assert all(e.user_id == user for e in context.related_episodes)
    assert all(n.user_id == user for n in context.related_entities)
    assert all(r.user_id == user for r in context.related_relations)


@pytest.mark.parametrize(
    ("user_id", "query", "limit", "field"),
    [
        ("u", "", None, "query"),
        ("u", "   \n", None, "query"),
        ("", "hello", None, "user_id"),
        ("u", "x" * 8001, None, "query"),
        ("u", "hello", 0, "limit"),
        ("u", "where \ud800 now", None, "query"),  # a lone surrogate (JSON allows one): not text
        ("u", "hello", 2.5, "limit"),  # not a count: it failed later, as a degraded answer
        ("u", "hello", True, "limit"),
    ],
)
def test_bad_recall_input_is_rejected(
    client: MemoryClient, user_id: str, query: str, limit: int | None, field: str
) -> None:
    with pytest.raises(QueryRejected) as info:
        client.retrieve_memory(user_id, query, limit=limit)
    assert info.value.field == field


def test_an_as_of_or_occurred_at_outside_the_calendar_in_utc_is_rejected(
    client: MemoryClient, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    """Aware times the API accepts, which the Neo4j driver cannot store or compare in UTC ("Ticks out of
    range"): recall came back degraded (503 with strict) once an episode matched; an episode with such an
    occurred_at was accepted, for a write that would meet the same driver error."""
    user = new_user("calendar-ends")
    store.save_episode(record(user, "my sister Anna lives in Lisbon"), entities("Anna"), [])
    for edge in (
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
        datetime.max.replace(tzinfo=timezone(-timedelta(hours=14))),
    ):
        with pytest.raises(QueryRejected) as refused:
            client.retrieve_memory(user, "Lisbon", as_of=edge, strict=True)
        assert refused.value.field == "as_of"
        with pytest.raises(EpisodeRejected) as rejected:
            client.add_episode(user, "s", [{"role": "user", "content": "hi"}], occurred_at=edge)
        assert rejected.value.field == "occurred_at"


def test_a_budget_that_is_no_count_of_milliseconds_is_rejected(client: MemoryClient) -> None:
    for budget_ms in (0, 2.5, 120_000):
        with pytest.raises(QueryRejected) as info:
            client.retrieve_memory("u", "hello", budget_ms=budget_ms)  # type: ignore[arg-type]
        assert info.value.field == "budget_ms"


def test_recall_is_audited_without_query_text(
    client: MemoryClient, store: Neo4jGraphStore, new_user: NewUser, caplog: pytest.LogCaptureFixture
) -> None:
    user = new_user("audit")
    wanted = seed(store, user, new_user("x"))
    with caplog.at_level(logging.INFO, logger="memory.audit"):
        client.retrieve_memory(user, "secret question about Lisbon")
    [entry] = [r for r in caplog.records if r.name == "memory.audit"]
    assert entry.user_id == user and wanted in entry.episode_ids  # type: ignore[attr-defined]
    assert entry.degraded is False and entry.latency_ms >= 0  # type: ignore[attr-defined]
    assert "secret question" not in entry.getMessage() and "secret question" not in str(entry.__dict__)


@pytest.mark.usefixtures("neo4j_restorer")
def test_neo4j_down_gives_a_degraded_context_within_the_budget_and_strict_raises(
    client: MemoryClient, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    from tests.services import services

    user = new_user("down")
    seed(store, user, new_user("x"))
    client.retrieve_memory(user, "Lisbon")  # connections made while Neo4j is up
    services("down", "neo4j")
    started = time.monotonic()
    context = client.retrieve_memory(user, "Lisbon", budget_ms=1000)
    assert time.monotonic() - started < 1.5
    assert context.degraded and context.related_episodes == [] and context.reason
    with pytest.raises(StoreUnavailable):
        client.retrieve_memory(user, "Lisbon", strict=True)
    services("up", "neo4j")
    # A Neo4j just started plans its first queries slowly: allow it more than the default budget once.
    assert not client.retrieve_memory(user, "Lisbon", budget_ms=20_000).degraded


def test_forget_user_erases_graph_dead_letters_and_cache_and_keeps_others(
    client: MemoryClient, store: Neo4jGraphStore, clean_redis: RedisClient, new_user: NewUser
) -> None:
    user, other = new_user("gone"), new_user("kept")
    seed(store, user, other)
    DeadLetterStore(clean_redis).add(
        stage="extract",
        task_name="memory.extract_episode",
        task_id="t",
        episode_id="ep-x",
        user_id=user,
        payload={"episode": {"id": "ep-x"}},
        error_class="StoreUnavailable",
        message="down",
    )
    clean_redis.set(keywords_cache(user_tag(user), "abc"), "[]")
    clean_redis.set(keywords_cache(user_tag(other), "abc"), "[]")

    report = client.forget_user(user)
    assert (report.episodes, report.entities, report.relationships) == (2, 4, 1)
    assert (report.dead_letters, report.cached_keywords) == (1, 1)
    with store._session() as s:
        assert s.run("MATCH (n {user_id: $u}) RETURN count(n) AS n", u=user).single(strict=True)["n"] == 0
    assert DeadLetterStore(clean_redis).count() == 0
    assert list(clean_redis.scan_iter(keywords_cache_pattern(user_tag(user)))) == []
    assert clean_redis.exists(keywords_cache(user_tag(other), "abc")) == 1
    assert store.stats(other).episodes == 1
    again = client.forget_user(user)
    assert (again.episodes, again.entities, again.dead_letters) == (0, 0, 0)


def test_memctl_recall_and_forget(store: Neo4jGraphStore, new_user: NewUser) -> None:
    from tests.test_policy_and_dlq import memctl

    user = new_user("cli")
    wanted = seed(store, user, new_user("x"))
    out = memctl("recall", "--user", user, "Where does Anna live?", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["related_episodes"][0]["id"] == wanted
    plain = memctl("recall", "--user", user, "Where does Anna live?")
    assert "matched: Anna moved to Lisbon" in plain.stdout  # the passage, after the summary line
    assert memctl("recall", "--user", user, "   ").returncode == 2
    gone = memctl("forget", "--user", user, "--yes")
    assert gone.returncode == 0 and json.loads(gone.stdout)["episodes"] == 2
    assert store.stats(user).episodes == 0


def test_the_first_chinese_recall_of_a_process_answers_within_its_budget(
    store: Neo4jGraphStore, new_user: NewUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first Chinese query of a process loads jieba's dictionary (1.4-2 s here) before the search; that
    load used up the budget, so a fresh process answered degraded although the store was healthy."""
    from tests.test_policy_and_dlq import memctl

    user = new_user("zh-first")
    beijing = record(user, "用户说北京的气候很干燥，冬天很冷。", summary="北京的气候")
    store.save_episode(beijing, entities("北京"), [])
    monkeypatch.setenv("MEMORY_RECALL_BUDGET_MS", "500")
    out = memctl("recall", "--user", user, "北京冬天冷吗", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert (answer["degraded"], [e["id"] for e in answer["related_episodes"]]) == (False, [beijing.id])


users = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=20).filter(str.strip)
queries = st.one_of(
    st.sampled_from([*CRAFTED[:-1], "Anna", "Lisbon", "laptop", "北京", "AND", "OR", "*:*"]),
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=60).filter(str.strip),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(me=users, query=queries)
@example(me="0 ", query="Anna")  # the same user as "0": ids are stripped wherever they enter
def test_recall_never_leaks_for_random_users_and_queries(
    client: MemoryClient, store: Neo4jGraphStore, new_user: NewUser, me: str, query: str
) -> None:
    example_id = uuid.uuid4().hex[:8]
    user, other = new_user(f"{example_id}-{me}"), new_user(f"{example_id}-other")
    seed(store, user, other)
    owner = check_user_id(user)  # the user as stored and recalled (add_episode and recall strip ids alike)
    context = client.retrieve_memory(user, query)
    assert all(e.user_id == owner for e in context.related_episodes)
    assert all(n.user_id == owner for n in context.related_entities)
    assert all(r.user_id == owner for r in context.related_relations)
    assert client._recall().counters.foreign_results_dropped == 0
