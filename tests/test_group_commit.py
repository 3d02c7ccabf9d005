"""Persistence in batches (worker/graph/group_commit.py): episodes waiting together share one Neo4j
transaction, each caller still gets its own outcome, and one refused episode fails alone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from api_stub.client import MemoryClient
from tests.factories import entities, record, relation
from tests.ingest_helpers import graph_facts
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker import keys, stats
from worker.deadletter import DeadLetterStore
from worker.errors import StoreRequestError
from worker.graph.group_commit import GroupCommit
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.inflight import InFlight
from worker.models import EpisodeRecord, SaveResult

Workers = Callable[..., WorkerProcess]


def save_together(commit: GroupCommit, records: list[EpisodeRecord]) -> list[SaveResult | BaseException]:
    """Every record saved from its own thread at once, as persist threads do; each one's result or error."""
    outcomes: list[SaveResult | BaseException] = [RuntimeError("not run")] * len(records)
    start = threading.Barrier(len(records))

    def one(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = commit.save(records[i], entities("Ada", "Bo"), [relation("Ada", "Bo")])
        except Exception as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(records))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


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
    commit = GroupCommit(store, max_batch=50, linger_s=0.5, wait_s=60)
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


def test_a_worker_persists_in_batches_and_dead_letters_only_the_bad_episode(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    """Episodes queued before the worker starts reach the persist stage together: fewer transactions than
    episodes (the metrics' counters), every receipt reports its own outcome, the one whose id another user
    holds is dead-lettered alone, nothing stays in flight or unacknowledged."""
    owner, user = new_user("owner"), new_user("batched")
    taken = record(owner, "held by another user")
    assert store.save_episode(taken, [], []).created
    said = [{"role": "user", "content": "I walked with Ada and Bo by the river."}]
    receipts = [client.add_episode(user, f"s{i}", said) for i in range(40)]
    receipts.append(client.add_episode(user, "bad", said, episode_id=taken.id))
    workers(MEMORY_PERSIST_BATCH_WAIT_MS="300")
    states = {s.episode_id: s.state for s in client.wait(receipts, timeout_s=120)}
    assert states.pop(taken.id) == "dead_lettered"
    assert set(states.values()) == {"persisted"} and len(states) == 40
    letters = DeadLetterStore(clean_redis).list()
    assert [(d.episode_id, d.stage, d.error_class) for d in letters] == [(taken.id, "persist", "StoreRequestError")]
    totals: dict[str, Any] = stats.Stats(clean_redis).snapshot()
    assert totals[stats.PERSIST_TRANSACTION_EPISODES] == 40
    assert totals[stats.PERSIST_TRANSACTIONS] < 40 / 2  # batches, not one transaction per episode
    assert store.stats(user).episodes == 40 and store.stats(owner).episodes == 1
    assert InFlight(clean_redis).count() == 0
    assert clean_redis.hlen(keys.KOMBU_UNACKED) == 0


def test_a_batch_of_one_writes_without_a_writer_thread(store: Neo4jGraphStore, new_user: Callable[[str], str]) -> None:
    user = new_user("alone")
    commits: list[int] = []
    before = {t.name for t in threading.enumerate()}
    commit = GroupCommit(store, max_batch=1, linger_s=1.0, wait_s=60, committed=commits.append)
    result = commit.save(record(user, "on its own"), [], [])
    assert result.created and commits == [1]
    assert "persist-group-commit" not in {t.name for t in threading.enumerate()} - before
