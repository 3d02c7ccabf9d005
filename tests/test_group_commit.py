"""Persistence in batches (worker/graph/group_commit.py): episodes waiting together share one Neo4j
transaction, each caller still gets its own outcome, and one refused episode fails alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from api_stub.client import MemoryClient
from tests.factories import entities, record, relation
from tests.ingest_helpers import graph_facts, wait_until
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker import keys, stats
from worker.deadletter import DeadLetterStore
from worker.errors import StoreRequestError, StoreUnavailable
from worker.graph.group_commit import GroupCommit
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.inflight import InFlight
from worker.keys import EXTRACT_QUEUE, PERSIST_QUEUE
from worker.models import EpisodeRecord, SaveResult, SessionProgress
from worker.sessions import progress_key
from worker.settings import Settings

Workers = Callable[..., WorkerProcess]


def save_all(saves: list[Callable[[], Any]], apart_s: float = 0.0) -> list[Any]:
    """Each save from its own thread, as persist threads do (at once, or handed over in order apart_s
    apart); each one's result or error."""
    outcomes: list[Any] = [RuntimeError("not run")] * len(saves)
    start = threading.Barrier(len(saves)) if not apart_s else None

    def one(i: int) -> None:
        if start is not None:
            start.wait()
        try:
            outcomes[i] = saves[i]()
        except Exception as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(saves))]
    for t in threads:
        t.start()
        time.sleep(apart_s)
    for t in threads:
        t.join(60)
    return outcomes


def save_together(commit: GroupCommit, records: list[EpisodeRecord]) -> list[SaveResult | BaseException]:
    return save_all([partial(commit.save, r, entities("Ada", "Bo"), [relation("Ada", "Bo")]) for r in records])


def test_episodes_waiting_together_share_a_transaction_and_each_gets_its_own_outcome(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("batch")
    commits: list[int] = []
    commit = GroupCommit(store, max_batch=50, linger_s=1.0, wait_s=60, committed=commits.append)
    records = [record(user, f"talk {i} with Ada and Bo", session_id=f"s{i}") for i in range(20)]
    outcomes = save_together(commit, records)
    assert all(isinstance(o, SaveResult) and o.created and o.outcome == "created" for o in outcomes)
    assert [o.episode_id for o in outcomes if isinstance(o, SaveResult)] == [r.id for r in records]
    assert sum(commits) == 20 and len(commits) <= 2  # all waited within one linger: one transaction, two at most
    facts = graph_facts(store, user)
    assert facts["episodes"] == 20 and sorted(facts["names"]) == ["Ada", "Bo"]
    assert facts["mentions"] == facts["pairs"] == facts["counters"]


def test_one_refused_episode_fails_alone_and_the_rest_of_its_batch_commits(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    owner, other = new_user("owner"), new_user("other")
    taken = record(owner, "the owner's own episode")
    assert store.save_episode(taken, [], []).created
    commits: list[int] = []
    commit = GroupCommit(store, max_batch=50, linger_s=1.0, wait_s=60, committed=commits.append)
    records = [record(other, f"episode {i}", session_id=f"s{i}") for i in range(9)]
    records.insert(4, record(other, "reuses an id another user holds", episode_id=taken.id))
    outcomes = save_together(commit, records)
    refused = outcomes.pop(4)
    assert isinstance(refused, StoreRequestError) and "another user" in str(refused)
    assert all(isinstance(o, SaveResult) and o.created for o in outcomes)
    assert store.stats(other).episodes == 9 and store.stats(owner).episodes == 1
    assert sum(commits) == 9  # the refused one never committed; the others did, alone after the batch failed


def test_the_same_episode_twice_at_once_is_written_once(store: Neo4jGraphStore, new_user: Callable[[str], str]) -> None:
    user = new_user("twice")
    commits: list[int] = []
    commit = GroupCommit(store, max_batch=50, linger_s=0.5, wait_s=60, committed=commits.append)
    one = record(user, "a redelivered save meets its original")
    outcomes = save_together(commit, [one, one, record(user, "another", session_id="s2")])
    results = [o for o in outcomes if isinstance(o, SaveResult)]
    assert len(results) == 3
    assert sorted((r.created, r.outcome) for r in results if r.episode_id == one.id) == [
        (False, "exists"),
        (True, "created"),
    ]
    facts = graph_facts(store, user)
    assert facts["episodes"] == 2 and facts["mentions"] == facts["pairs"] == facts["counters"]
    assert sorted(commits) == [1, 2]  # the second copy waited for the next transaction


def save_lines(commit: GroupCommit, items: list[tuple[EpisodeRecord, SessionProgress]]) -> list[Any]:
    """Handed over in order, 0.1 s apart (within one linger)."""
    return save_all([partial(commit.save, r, entities("Ada"), [], p) for r, p in items], apart_s=0.1)


def line(user: str, session: str, hashes: tuple[str, ...], start: int) -> SessionProgress:
    return SessionProgress(
        key=progress_key(user, session),
        user_id=user,
        session_id=session,
        extracted=len(hashes),
        digest="-".join(hashes),
        hashes=hashes,
        start=start,
    )


def test_two_sends_of_one_session_are_never_in_one_transaction(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    """The second send is checked against the line the first one left (stored), as if written one by one:
    here the first is refused as a conflict (its id is taken with other content), so the longer send, planned
    from the start, must still be written, not dropped as already extracted."""
    user = new_user("line")
    taken = record(user, "other content", session_id="elsewhere")
    assert store.save_episode(taken, [], []).created
    reused = record(user, "m1", session_id="s", episode_id=taken.id).model_copy(update={"source_digest": "x"})
    longer = record(user, "m1 m2", session_id="s")
    commits: list[int] = []
    commit = GroupCommit(store, max_batch=50, linger_s=1.0, wait_s=60, committed=commits.append)
    first, second = save_lines(
        commit, [(reused, line(user, "s", ("h1",), 0)), (longer, line(user, "s", ("h1", "h2"), 0))]
    )
    assert first.outcome == "conflict"
    assert second.outcome == "created"
    assert len(commits) == 2  # one send of the session per transaction
    assert store.write_state(user, progress_key(user, "s"), "-").line.extracted == 2  # type: ignore[union-attr]


def test_a_user_being_erased_waits_alone_and_the_rest_of_the_batch_is_written(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    erased, others = new_user("erasing"), new_user("others")
    window = store.mark_erased(erased, time.time() - 60)  # an erasure still deleting
    commit = GroupCommit(store, max_batch=50, linger_s=1.0, wait_s=60)
    records = [record(others, f"e{i}", session_id=f"s{i}") for i in range(5)]
    records.append(record(erased, "sent after the erasure began").model_copy(update={"accepted_at": time.time()}))
    outcomes = save_together(commit, records)
    assert [o.outcome for o in outcomes[:5] if isinstance(o, SaveResult)] == ["created"] * 5
    assert isinstance(outcomes[5], SaveResult) and outcomes[5].outcome == "erasing"
    store.erasure_done(erased, window)
    assert commit.save(records[5], entities("Ada", "Bo"), [relation("Ada", "Bo")]).created


def test_a_store_outage_reaches_every_episode_of_the_batch_as_transient(
    settings: Settings, new_user: Callable[[str], str]
) -> None:
    closed = Neo4jGraphStore.from_settings(
        settings.model_copy(update={"neo4j_uri": "bolt://127.0.0.1:9", "neo4j_retry_time_s": 0.0})
    )
    user = new_user("outage")
    commit = GroupCommit(closed, max_batch=50, linger_s=0.5, wait_s=60)
    outcomes = save_together(commit, [record(user, f"e{i}", session_id=f"s{i}") for i in range(4)])
    closed.close()
    assert all(isinstance(o, StoreUnavailable) for o in outcomes)
    assert len({id(o) for o in outcomes}) == 4  # each caller raises its own error


def persist_once_all_extracted(workers: Workers, redis: RedisClient, waiting: int) -> None:
    """An extract worker that leaves its extractions to the persist queue first; a persist worker only once
    `waiting` extractions wait for it, so that its threads take them at once."""
    workers("--queues", EXTRACT_QUEUE, MEMORY_PERSIST_INLINE="false")
    wait_until(lambda: redis.llen(PERSIST_QUEUE) == waiting, 60, f"{waiting} extractions waiting for persistence")
    workers("--queues", PERSIST_QUEUE, MEMORY_PERSIST_BATCH_WAIT_MS="300")


def test_a_worker_writes_what_waits_in_few_transactions(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    """40 extractions waiting when a persist worker starts are written in a few transactions (the metrics'
    counters), every receipt reports its own outcome, nothing stays in flight or unacknowledged."""
    user = new_user("batched")
    said = [{"role": "user", "content": "I walked with Ada and Bo by the river."}]
    receipts = [client.add_episode(user, f"s{i}", said) for i in range(40)]
    persist_once_all_extracted(workers, clean_redis, 40)
    states = [s.state for s in client.wait(receipts, timeout_s=120)]
    assert states == ["persisted"] * 40
    totals: dict[str, Any] = stats.Stats(clean_redis).snapshot()
    # 32 threads take 32 at once: batches, not 40 commits (a message the broker hands out again is counted
    # again, which is why this is a ratio)
    assert totals[stats.PERSIST_TRANSACTION_EPISODES] >= 40
    assert totals[stats.PERSIST_TRANSACTION_EPISODES] / totals[stats.PERSIST_TRANSACTIONS] >= 5
    facts = graph_facts(store, user)
    assert facts["episodes"] == 40 and facts["mentions"] == facts["pairs"] == facts["counters"]
    assert InFlight(clean_redis).count() == 0
    # acknowledged after the outcome was stored, and removed from Redis within MEMORY_ACK_BATCH_MS after that
    wait_until(lambda: clean_redis.hlen(keys.KOMBU_UNACKED) == 0, 10, "acknowledgements in Redis")


def test_a_worker_dead_letters_only_the_bad_episode_of_a_batch(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    owner, user = new_user("owner"), new_user("batched")
    taken = record(owner, "held by another user")
    assert store.save_episode(taken, [], []).created
    said = [{"role": "user", "content": "I walked with Ada and Bo by the river."}]
    receipts = [client.add_episode(user, f"s{i}", said) for i in range(10)]
    receipts.append(client.add_episode(user, "bad", said, episode_id=taken.id))
    persist_once_all_extracted(workers, clean_redis, 11)
    states = {s.episode_id: s.state for s in client.wait(receipts, timeout_s=120)}
    assert states.pop(taken.id) == "dead_lettered"
    assert set(states.values()) == {"persisted"} and len(states) == 10
    letters = DeadLetterStore(clean_redis).list()
    assert [(d.episode_id, d.stage, d.error_class) for d in letters] == [(taken.id, "persist", "StoreRequestError")]
    assert store.stats(user).episodes == 10 and store.stats(owner).episodes == 1
    assert InFlight(clean_redis).count() == 0


def test_a_batch_of_one_writes_without_a_writer_thread(store: Neo4jGraphStore, new_user: Callable[[str], str]) -> None:
    user = new_user("alone")
    commits: list[int] = []
    before = {t.name for t in threading.enumerate()}
    commit = GroupCommit(store, max_batch=1, linger_s=1.0, wait_s=60, committed=commits.append)
    result = commit.save(record(user, "on its own"), [], [])
    assert result.created and commits == [1]
    assert "persist-group-commit" not in {t.name for t in threading.enumerate()} - before


def test_a_failure_to_count_a_commit_does_not_fail_its_episodes(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("uncounted")

    def count(n: int) -> None:
        raise RuntimeError("stats unavailable")

    commit = GroupCommit(store, max_batch=50, linger_s=0.5, wait_s=60, committed=count)
    records = [record(user, f"talk {i} with Ada and Bo", session_id=f"s{i}") for i in range(5)]
    outcomes = save_together(commit, records)
    assert all(isinstance(o, SaveResult) and o.outcome == "created" for o in outcomes), outcomes
    assert store.stats(user).episodes == 5


def test_one_episode_id_sent_by_two_users_in_one_batch_is_stored_for_one_and_refused_for_the_other(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    """Issue 33, item 1: both sends were reported stored while only the first was (the second's claim never
    ran). Now they are written as one after the other would be: the second is refused as another user's id."""
    first, second = new_user("twin-a"), new_user("twin-b")
    shared = f"ep_shared_{time.time_ns()}"
    commits: list[int] = []
    commit = GroupCommit(store, max_batch=50, linger_s=2.0, wait_s=60, committed=commits.append)
    a = record(first, "the first user's words about Ada", episode_id=shared)
    b = record(second, "the second user's words about Bo", episode_id=shared)
    outcomes = save_all([partial(commit.save, a, entities("Ada"), []), partial(commit.save, b, entities("Bo"), [])])
    created = [o for o in outcomes if isinstance(o, SaveResult) and o.created]
    refused = [o for o in outcomes if isinstance(o, StoreRequestError)]
    assert len(created) == 1 and len(refused) == 1, outcomes
    owner = first if outcomes[0] is created[0] else second
    with store._session() as s:
        row = s.run("MATCH (e:Episode {id: $id}) RETURN e.user_id AS u, e.content AS c", id=shared).single()
    assert row is not None and row["u"] == owner
    assert ("first" in row["c"]) == (owner == first)
    assert graph_facts(store, second if owner == first else first)["episodes"] == 0


def test_the_same_episode_id_twice_in_one_save_is_saved_as_two_sends_one_after_the_other(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("twice")
    shared = f"ep_twice_{time.time_ns()}"
    one = record(user, "first send", episode_id=shared, session_id="s1")
    other = record(user, "another send", episode_id=shared, session_id="s2")
    results = store.save_episodes([(one, [], []), (other, [], [])])
    assert [r.outcome for r in results] == ["created", "exists"]  # as one after the other (no digests here)
    lines = [
        SessionProgress(key=progress_key(user, "s1"), user_id=user, session_id="s1", extracted=1, digest="d1"),
        SessionProgress(key=progress_key(user, "s2"), user_id=user, session_id="s2", extracted=1, digest="d2"),
    ]
    again = record(user, "a third send", episode_id=f"{shared}-b", session_id="s1")
    results = store.save_episodes([(again, [], []), (again, [], [])], lines)
    assert results[0].outcome == "created" and results[1].outcome == "exists"
    with store._session() as s:
        digests = {
            r["k"]: r["d"]
            for r in s.run("MATCH (p:SessionProgress {user_id: $u}) RETURN p.key AS k, p.digest AS d", u=user)
        }
    assert digests[progress_key(user, "s1")] == "d1"  # the line of the send written, each with its own
    assert digests.get(progress_key(user, "s2"), "") != "d2"  # the second was found stored: its line not moved


def test_a_send_held_back_by_one_key_is_not_overtaken_by_a_later_send_of_its_session(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    """Review of issue 33 item 1: A(s1, e1), B(s2, e1), C(s2, e2). B waits for A's id; C, of B's session,
    must wait behind B, not be written before it."""
    commit = GroupCommit(store, max_batch=50, linger_s=0.5, wait_s=60)
    user = new_user("order")
    a = record(user, "a", session_id="s1", episode_id="e1")
    b = record(user, "b", session_id="s2", episode_id="e1")
    c = record(user, "c", session_id="s2", episode_id="e2")
    pending = [commit_item(a), commit_item(b), commit_item(c)]
    batch, later = commit._gather(pending)
    assert [p.write[0].content for p in batch] == ["a"]
    assert [p.write[0].content for p in later] == ["b", "c"]


def commit_item(r: EpisodeRecord) -> Any:
    from worker.graph.group_commit import _Pending

    return _Pending((r, [], []), None)
