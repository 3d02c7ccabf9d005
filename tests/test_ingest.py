"""The write path end to end: MemoryClient → Redis → real `memctl worker` processes → Neo4j."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from api_stub.client import MemoryClient
from tests.ingest_helpers import episodes_for, graph_facts
from tests.llm_standin import StandIn, answer
from tests.services import RedisClient
from tests.test_policy_and_dlq import memctl
from tests.workers import WorkerProcess
from worker.errors import EpisodeRejected
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keys import EXTRACT_QUEUE, PERSIST_QUEUE

Workers = Callable[..., WorkerProcess]


def test_200_episodes_from_5_users(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    users = [new_user(f"u{i}") for i in range(5)]
    items, names = episodes_for(users, 40)
    workers()
    receipts = client.add_episodes(items)
    states = client.wait(receipts, timeout_s=180)
    assert [s.state for s in states] == ["persisted"] * 200
    for user in users:
        facts = graph_facts(store, user)
        assert facts["episodes"] == 40
        assert sorted(facts["names"]) == sorted(names[user])  # deduplicated per user
        assert facts["mentions"] == facts["pairs"] == facts["counters"]


def test_an_extract_worker_alone_writes_each_episode_in_its_one_task(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    """With the default MEMORY_PERSIST_INLINE, no persist message is published: nothing consumes the persist
    queue here, so one would wait there. Outcomes (a send again: unchanged) still reach wait()."""
    user = new_user("inline")
    items, _ = episodes_for([user], 20, seed=5)
    workers("--queues", EXTRACT_QUEUE)
    states = client.wait(client.add_episodes(items), timeout_s=120)
    assert [s.state for s in states] == ["persisted"] * 20
    again = client.wait([client.add_episode(**items[0])], timeout_s=60)
    assert again[0].state == "unchanged"
    assert clean_redis.llen(PERSIST_QUEUE) == 0
    facts = graph_facts(store, user)
    assert facts["episodes"] == 20 and facts["mentions"] == facts["pairs"] == facts["counters"]


def test_invalid_input_enqueues_nothing(clean_redis: RedisClient, client: MemoryClient) -> None:
    good = {"user_id": "u", "session_id": "s", "messages": [{"role": "user", "content": "hi"}]}
    bad = {"user_id": "u", "session_id": "s", "messages": [{"role": "robot", "content": "hi"}]}
    with pytest.raises(EpisodeRejected) as info:
        client.add_episodes([good, bad])
    assert info.value.field == "[1].messages.0.role"
    with pytest.raises(EpisodeRejected):
        client.add_episode("", "s", [{"role": "user", "content": "hi"}])
    assert clean_redis.llen(EXTRACT_QUEUE) == 0


def test_a_session_sent_again_extracts_only_the_new_messages(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    standin: StandIn,
    new_user: Callable[[str], str],
) -> None:
    standin.default = lambda _request: answer({"summary": "ok", "entities": [{"name": "Anna"}]})
    user = new_user("inc")
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i}"} for i in range(4)]
    workers(MEMORY_LLM_MODEL="openai/stand-in", MEMORY_LLM_API_BASE=standin.url, MEMORY_LLM_API_KEY="sk-x")

    first = client.add_episode(user, "chat", history)
    assert client.wait([first], 60)[0].state == "persisted"
    longer = [*history, {"role": "user", "content": "message number 4"}, {"role": "assistant", "content": "ok 5"}]
    second = client.add_episode(user, "chat", longer)
    assert client.wait([second], 60)[0].state == "persisted"
    assert standin.calls == 2
    prompt = standin.requests[1]["messages"][-1]["content"]
    new_part = prompt.split("New messages:")[1]
    assert "message number 4" in new_part and "ok 5" in new_part and "message number 0" not in new_part
    assert "Earlier context" in prompt and "message number 3" in prompt.split("New messages:")[0]

    again = client.add_episode(user, "chat", longer)
    assert client.wait([again], 60)[0].state == "unchanged"
    assert standin.calls == 2  # the same history again: no LLM call, nothing written
    assert graph_facts(store, user)["episodes"] == 2
    with store._session() as s:
        counts = s.run("MATCH (e:Episode {user_id: $u}) RETURN e.message_count AS n ORDER BY n DESC", u=user).value()
    assert counts == [4, 2]


def test_add_episode_returns_before_any_extraction(
    clean_redis: RedisClient, client: MemoryClient, new_user: Callable[[str], str]
) -> None:
    from worker.inflight import InFlight

    receipt = client.add_episode(new_user("q"), "s", [{"role": "user", "content": "no worker is running"}])
    # Accepted and recorded, nothing done yet: the call only validated and enqueued.
    assert InFlight(clean_redis).count() == 1
    assert client.wait([receipt], timeout_s=0.5)[0].state == "pending"


def test_memctl_import_waits_for_the_outcome_and_health_sees_the_workers(
    clean_redis: RedisClient, workers: Workers, store: Neo4jGraphStore, new_user: Callable[[str], str], tmp_path: Path
) -> None:
    user = new_user("cli")
    items, _ = episodes_for([user], 8, seed=9)
    jsonl = tmp_path / "conversations.jsonl"
    jsonl.write_text("\n".join(json.dumps(item) for item in items) + "\n", encoding="utf-8")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"user_id": "u", "session_id": "s", "messages": []}\n', encoding="utf-8")
    assert memctl("import", str(bad)).returncode == 1  # invalid: nothing enqueued
    good = json.dumps(items[0])
    for lines, named in (
        ([good, "", "[1, 2]"], "line 3: not a JSON object"),
        ([good, "", good, '{"user_id": 1}'], "line 4"),
    ):
        bad.write_text("\n".join(lines) + "\n", encoding="utf-8")  # a blank line does not shift the number
        refused = memctl("import", str(bad))
        assert (refused.returncode, named in refused.stderr, "Traceback" in refused.stderr) == (1, True, False)
    assert clean_redis.llen(EXTRACT_QUEUE) == 0
    workers()
    assert memctl("health").returncode == 0
    out = memctl("import", str(jsonl), "--wait", "60")
    assert out.returncode == 0, out.stderr
    assert "enqueued 8 episodes" in out.stdout and "persisted=8" in out.stdout
    assert graph_facts(store, user)["episodes"] == 8
