"""Forgotten means gone: work accepted before an erasure never writes after it (issue 11, defect 3)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from api_stub.client import MemoryClient
from tests.ingest_helpers import graph_facts
from tests.llm_standin import Reply, StandIn
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker.deadletter import DeadLetterStore
from worker.errors import StoreUnavailable
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.models import Limits, build_episode
from worker.pipeline import episode_payload, extract_stage, persist_stage
from worker.settings import Settings

SAID = [{"role": "user", "content": "My brother Tomas moved to Vilnius last spring."}]


def test_an_episode_queued_before_forget_user_is_not_written_after_it(
    clean_redis: RedisClient,
    workers: Callable[..., WorkerProcess],
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    user = new_user("erase")
    queued = client.add_episode(user, "s1", SAID)  # no worker yet: it waits in the queue
    report = client.forget_user(user)
    assert report.episodes == 0
    workers()
    assert client.wait([queued], 60)[0].state == "forgotten"
    assert graph_facts(store, user)["episodes"] == 0
    # What the user says after the erasure is remembered as usual.
    later = client.add_episode(user, "s1", SAID)
    assert client.wait([later], 60)[0].state == "persisted"
    assert graph_facts(store, user)["episodes"] == 1


def test_an_extraction_made_before_the_erasure_is_dropped_by_the_persist_transaction(
    settings: Settings, client: MemoryClient, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("erase-late")
    payload = episode_payload(build_episode(user, "s1", SAID, limits=Limits()))
    extraction = extract_stage(payload, settings=settings, store=store, llm=None)
    assert extraction["status"] == "extracted"
    client.forget_user(user)  # between the two stages: the extraction is already on its way to persist
    assert persist_stage(extraction, save=store.save_episode)["status"] == "forgotten"
    assert extract_stage(payload, settings=settings, store=store, llm=None)["status"] == "forgotten"
    facts = graph_facts(store, user)
    assert (facts["episodes"], facts["names"]) == (0, [])
    with store._session() as s:  # no session line either: nothing of the user is left behind
        assert s.run("MATCH (p:SessionProgress {user_id: $u}) RETURN count(p)", u=user).single(strict=True)[0] == 0


def test_a_stage_failing_for_good_after_the_erasure_keeps_no_dead_letter(
    clean_redis: RedisClient,
    workers: Callable[..., WorkerProcess],
    client: MemoryClient,
    standin: StandIn,
    new_user: Callable[[str], str],
) -> None:
    started = threading.Event()

    def slow_refusal(_request: dict[str, object]) -> Reply:
        started.set()
        return Reply(status=401, content="bad key", delay_s=3.0)  # permanent: would be dead-lettered

    standin.default = slow_refusal
    workers(MEMORY_LLM_MODEL="openai/stand-in", MEMORY_LLM_API_BASE=standin.url, MEMORY_LLM_API_KEY="sk-x")
    user = new_user("erase-dlq")
    receipt = client.add_episode(user, "s1", SAID)
    assert started.wait(30)
    client.forget_user(user)  # while the model call is under way
    assert client.wait([receipt], 60)[0].state == "forgotten"
    assert DeadLetterStore(clean_redis).count() == 0
    assert not list(clean_redis.scan_iter("memory:dlq:*"))


def test_persists_wait_while_an_erasure_deletes_and_only_its_own_end_lets_them_go(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("erase-window")
    window = store.mark_erased(user, time.time())
    payload = episode_payload(build_episode(user, "s1", SAID, limits=Limits()))  # accepted after the mark
    extraction = extract_stage(payload, settings=settings, store=store, llm=None)
    with pytest.raises(StoreUnavailable):  # transient: the stage retries once the erasure is done
        persist_stage(extraction, save=store.save_episode)
    store.erasure_done(user, "another erasure's token")
    with pytest.raises(StoreUnavailable):
        persist_stage(extraction, save=store.save_episode)
    store.erasure_done(user, window)
    assert persist_stage(extraction, save=store.save_episode)["status"] == "persisted"


def test_a_send_planned_on_a_line_the_erasure_deleted_is_extracted_again_whole(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("erase-line")
    history = [{"role": "user", "content": f"Message {i} about Lisbon and Anna."} for i in range(6)]

    def extracted(n: int) -> dict[str, Any]:
        episode = build_episode(user, "s1", history[:n], limits=Limits())
        return extract_stage(episode_payload(episode), settings=settings, store=store, llm=None)

    assert persist_stage(extracted(4), save=store.save_episode)["status"] == "persisted"
    window = store.mark_erased(user, time.time())
    longer = extracted(6)  # sent after the mark, planned before the delete: only messages 5-6 are new to it
    assert longer["record"]["message_count"] == 2
    store.delete_user(user)
    store.erasure_done(user, window)
    outcome = persist_stage(longer, save=store.save_episode, extract_again=lambda _digest: extracted(6))
    assert outcome["status"] == "persisted"
    with store._session() as s:  # the whole send is remembered, not just the two messages after the old line
        sizes = s.run("MATCH (e:Episode {user_id: $u}) RETURN e.message_count", u=user).value()
    assert sizes == [6]


def test_an_erasure_longer_than_its_window_keeps_persists_waiting_until_its_last_batch(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    """Issue 33 item 3: each delete batch renews the erasure's window, so work accepted after the mark is not
    saved while later batches still delete (and half-deleted by them); a dead eraser's window still lapses."""
    user = new_user("erase-long")
    with store._session() as s:  # many small nodes: one per delete batch of one below
        s.run("UNWIND range(1, 3000) AS i CREATE (:Chunk {user_id: $u, seq: i})", u=user).consume()
    one_by_one = Neo4jGraphStore.__new__(Neo4jGraphStore)
    one_by_one.__dict__.update(store.__dict__, _delete_batch=1)
    window = store.mark_erased(user, time.time(), erasing_for_s=1.0)
    deleting = threading.Thread(target=lambda: one_by_one.delete_user(user, window=window, erasing_for_s=1.0))
    deleting.start()
    time.sleep(2.0)  # the window as first set has lapsed
    assert deleting.is_alive(), "the deletion ended too soon to show anything"
    extraction = extract_stage(
        episode_payload(build_episode(user, "s1", SAID, limits=Limits())), settings=settings, store=store, llm=None
    )
    with pytest.raises(StoreUnavailable):
        persist_stage(extraction, save=store.save_episode)
    deleting.join(120)
    store.erasure_done(user, window)
    assert persist_stage(extraction, save=store.save_episode)["status"] == "persisted"
    assert graph_facts(store, user)["episodes"] == 1


def test_a_dead_erasers_window_lapses(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("erase-dead")
    store.mark_erased(user, time.time(), erasing_for_s=0.5)  # the eraser dies here: no batch, no done
    time.sleep(1.0)
    extraction = extract_stage(
        episode_payload(build_episode(user, "s1", SAID, limits=Limits())), settings=settings, store=store, llm=None
    )
    assert persist_stage(extraction, save=store.save_episode)["status"] == "persisted"


def test_a_recall_cache_write_that_lands_after_forget_episode_is_dropped(
    clean_redis: RedisClient, store: Neo4jGraphStore, client: MemoryClient, new_user: Callable[[str], str]
) -> None:
    """Issue 33 item 10: LLM keywords or a query vector that a recall started before forget_episode (or
    forget_session) finishes after its purge of the user's caches: written, they would keep words of the
    forgotten conversation. Only the user erasure mark was checked."""
    from tests.factories import entities, record
    from worker import erasure, keys
    from worker.identity import user_tag

    user = new_user("late-cache")
    stored = record(user, "Tomas moved to Vilnius")
    store.save_episode(stored, entities("Tomas"), [])
    tag = user_tag(user)
    started = time.time()  # the recall began (its model call is under way)
    client.forget_episode(user, stored.id)
    late = [keys.keywords_cache(tag, "digest"), keys.query_vector_cache(tag, "digest")]
    for key in late:
        assert not erasure.set_unless_erased(clean_redis, tag, started, key, '["Vilnius"]', 600)
        assert not clean_redis.exists(key)
    later = time.time() + 0.01  # a recall that starts after the forget caches as before
    assert erasure.set_unless_erased(clean_redis, tag, later, late[0], '["Lisbon"]', 600)


def test_the_redis_erasure_mark_does_not_expire(
    clean_redis: RedisClient, client: MemoryClient, new_user: Callable[[str], str]
) -> None:
    """Issue 33 item 10: the dead-letter path checks this mark (Neo4j may be down); with a 7-day expiry, work
    accepted before the erasure that failed for good later kept the user's text in a dead letter."""
    from worker import keys
    from worker.identity import user_tag

    user = new_user("erase-mark")
    client.forget_user(user)
    assert clean_redis.ttl(keys.erasure_key(user_tag(user))) == -1  # kept, with no expiry
