"""Exactly what was said, once: episode ids, edited messages and concurrent sends of one session.

The first two tests are the defects of issue 11 (1 and 2) as a user meets them, through real workers; the
others drive both stages by hand to force the orderings that concurrency produces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from api_stub.client import MemoryClient
from tests.ingest_helpers import graph_facts
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.models import Limits, build_episode
from worker.pipeline import episode_payload, extract_stage, persist_stage
from worker.settings import Settings


def history(n: int, last: str | None = None) -> list[dict[str, str]]:
    lines = [
        "My sister Anna is visiting next week.",
        "That sounds lovely, how long is she staying?",
        "Ten days, then she flies home to Oslo.",
        "Enjoy the time together with her.",
        "We might take her to Tokyo for the weekend.",
        "Tokyo in spring is wonderful.",
    ]
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": lines[i]} for i in range(n)]
    if last is not None:
        messages[-1]["content"] = last
    return messages


def episode_sizes(store: Neo4jGraphStore, user: str) -> list[int]:
    with store._session() as s:
        return list(
            s.run("MATCH (e:Episode {user_id: $u}) RETURN e.message_count AS n ORDER BY e.created_at", u=user).value()
        )


def mentions(store: Neo4jGraphStore, user: str, name: str) -> int:
    with store._session() as s:
        found = s.run("MATCH (n:Entity {user_id: $u, name: $name}) RETURN n.mentions", u=user, name=name).value()
    return int(found[0]) if found else 0


def test_a_reused_episode_id_with_other_content_is_a_conflict_not_a_silent_loss(
    clean_redis: RedisClient,
    workers: Callable[..., WorkerProcess],
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    user = new_user("reuse")
    workers()
    first = client.add_episode(user, "s1", history(4), episode_id=f"c1-{user}")
    assert client.wait([first], 60)[0].state == "persisted"
    reused = client.add_episode(user, "s1", history(6), episode_id=f"c1-{user}")
    assert client.wait([reused], 60)[0].state == "conflict"  # told, not reported persisted while dropped
    assert episode_sizes(store, user) == [4] and mentions(store, user, "Tokyo") == 0
    # The session did not move: the two new messages are still new to it.
    derived = client.add_episode(user, "s1", history(6))
    assert client.wait([derived], 60)[0].state == "persisted"
    assert episode_sizes(store, user) == [4, 2] and mentions(store, user, "Tokyo") == 1


def test_an_edited_message_is_a_new_message_and_nothing_is_counted_twice(
    clean_redis: RedisClient,
    workers: Callable[..., WorkerProcess],
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    user = new_user("edit")
    workers()
    edited = history(4, last="Enjoy every day of it, all of you.")
    sends = [history(4), edited, edited + history(6)[4:]]
    for messages in sends:
        receipt = client.add_episode(user, "chat", messages)
        assert client.wait([receipt], 60)[0].state == "persisted"
    assert episode_sizes(store, user) == [4, 1, 2]  # the edited message, then the two new ones
    assert mentions(store, user, "Anna") == 1 and mentions(store, user, "Oslo") == 1  # one conversation
    assert mentions(store, user, "Tokyo") == 1
    facts = graph_facts(store, user)
    assert facts["mentions"] == facts["pairs"] == facts["counters"]


# --- orderings forced by hand: both stages run in this process, against the real store ----------------------


def extracted(settings: Settings, store: Neo4jGraphStore, user: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    episode = build_episode(user, "chat", messages, limits=Limits())
    outcome = extract_stage(episode_payload(episode), settings=settings, store=store, llm=None)
    assert outcome["status"] == "extracted"
    return outcome


def test_two_sends_extracted_at_once_longer_first_then_the_shorter_is_unchanged(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("race1")
    short, long = extracted(settings, store, user, history(4)), extracted(settings, store, user, history(6))
    assert persist_stage(long, save=store.save_episode)["status"] == "persisted"
    assert persist_stage(short, save=store.save_episode)["status"] == "unchanged"  # a retried short send, too
    assert episode_sizes(store, user) == [6] and mentions(store, user, "Anna") == 1


def test_two_sends_extracted_at_once_shorter_first_then_the_longer_is_extracted_again(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("race2")
    short, long = extracted(settings, store, user, history(4)), extracted(settings, store, user, history(6))
    assert persist_stage(short, save=store.save_episode)["status"] == "persisted"
    episode = build_episode(user, "chat", history(6), limits=Limits())
    again: list[dict[str, Any]] = []

    def extract_again(source_digest: str) -> dict[str, Any]:
        again.append(extract_stage(episode_payload(episode), settings=settings, store=store, llm=None))
        return again[-1]

    assert persist_stage(long, save=store.save_episode, extract_again=extract_again)["status"] == "persisted"
    assert len(again) == 1 and again[0]["record"]["message_count"] == 2  # only what the line lacked
    assert episode_sizes(store, user) == [4, 2] and mentions(store, user, "Anna") == 1


def test_an_id_reused_by_two_sends_extracted_at_once_is_refused_by_the_persist_transaction(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("reuse-race")
    sends = [build_episode(user, "chat", history(n), episode_id=f"c1-{user}", limits=Limits()) for n in (4, 6)]
    first, second = (extract_stage(episode_payload(e), settings=settings, store=store, llm=None) for e in sends)
    assert first["status"] == second["status"] == "extracted"  # both planned before either was stored
    assert persist_stage(first, save=store.save_episode)["status"] == "persisted"
    # The line moved (first send), the send is not at hand to plan again: saved as it is, and the claim
    # finds the id stored with other content.
    assert persist_stage(second, save=store.save_episode)["status"] == "conflict"
    assert episode_sizes(store, user) == [4] and mentions(store, user, "Tokyo") == 0


def test_work_without_an_acceptance_time_is_dropped_only_after_an_erasure() -> None:
    from worker.sessions import erased_since

    assert not erased_since(None, 0.0)  # never erased: a payload from before acceptance times is kept
    assert erased_since(None, 5.0)  # erased since: any erasure mark is later than such a payload
    assert erased_since(5.0, 5.0) and not erased_since(5.5, 5.0)
