"""The read before an extraction, in batches (worker/graph/state_reads.py): reads that extract threads ask
for together share one query on the real Neo4j and each thread gets its own state; one bad request fails
alone; a stalled read fails its own callers after their wait while the reads after it are answered."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pytest

from tests.factories import record
from tests.test_group_commit import line, save_all
from worker.errors import StoreUnavailable
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.graph.state_reads import GroupRead, StateRequest
from worker.sessions import WriteState, progress_key


def counted(read_many: Callable[[Sequence[StateRequest]], list[WriteState]], sizes: list[int]) -> Any:
    """read_many, noting the size of each batch it is given."""

    def read(requests: Sequence[StateRequest]) -> list[WriteState]:
        sizes.append(len(requests))
        return read_many(requests)

    return read


def test_reads_asked_together_share_one_query_and_each_gets_its_own_state(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    plain, erased, other = new_user("plain"), new_user("erased"), new_user("other")
    stored = record(plain, "already stored", session_id="done").model_copy(update={"source_digest": "d1"})
    assert store.save_episode(stored, [], [], line(plain, "done", ("h1", "h2"), 0)).created
    forgotten = record(plain, "forgotten later", session_id="gone")
    assert store.save_episode(forgotten, [], []).created
    store.forget(plain, time.time(), episode_id=forgotten.id)
    store.forget(plain, time.time(), session_id="dropped")
    store.erasure_done(erased, store.mark_erased(erased, time.time()))
    asked = [
        (plain, progress_key(plain, "done"), stored.id),  # a line of two messages, and the episode stored
        (plain, progress_key(plain, "new"), "ep-new"),  # nothing yet
        (plain, progress_key(plain, "gone"), forgotten.id),  # forgotten
        (erased, progress_key(erased, "s"), "ep-erased"),  # the user erased
        (other, progress_key(other, "done"), stored.id),  # another user's session: not plain's line
        (other, progress_key(plain, "done"), "ep-other"),  # plain's key asked for another user: no line
        (plain, progress_key(plain, "dropped"), "ep-late"),  # a send of a session forgotten since
    ] * 4
    sizes: list[int] = []
    group = GroupRead(counted(store.write_states, sizes), max_batch=64, linger_s=0.5, wait_s=30)
    states = save_all([partial(group.write_state, *a) for a in asked])
    assert states == [store.write_state(*a) for a in asked]  # each its own, as a read of its own gives
    assert sum(sizes) == len(asked) and max(sizes) > 1 and len(sizes) < len(asked)
    done, new, gone, gone_user, other_user, not_theirs, dropped = states[:7]
    assert done.line is not None and done.line.extracted == 2 and done.episode_user == plain
    assert done.episode_digest == "d1" and done.forgotten_at == 0.0
    assert new.line is None and new.episode_user is None and new.erased_at == 0.0
    assert gone.forgotten_at > 0 and gone.episode_user is None
    assert gone_user.erased_at > 0 and done.erased_at == 0.0
    assert other_user.line is None and other_user.episode_user == plain  # the id is taken (a conflict)
    assert not_theirs.line is None and not_theirs.forgotten_at == 0.0
    assert dropped.forgotten_at > 0 and dropped.line is None and new.forgotten_at == 0.0


def test_one_bad_request_fails_alone_and_the_rest_of_its_batch_is_answered(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("bad")

    def refusing(requests: Sequence[StateRequest]) -> list[WriteState]:
        if any(r.episode_id == "poison" for r in requests):
            raise ValueError("refused")
        return store.write_states(requests)

    sizes: list[int] = []
    group = GroupRead(counted(refusing, sizes), max_batch=64, linger_s=0.5, wait_s=30)
    ids = ["a", "b", "poison", "c", "d"]
    states = save_all([partial(group.write_state, user, progress_key(user, i), i) for i in ids])
    assert isinstance(states[2], ValueError)
    assert all(isinstance(s, WriteState) and s.line is None for i, s in enumerate(states) if i != 2)
    assert max(sizes) > 1  # they were asked in one batch, then read again one by one


def test_neo4j_unavailable_fails_every_read_of_the_batch_as_unavailable(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("away")

    def away(requests: Sequence[StateRequest]) -> list[WriteState]:
        raise StoreUnavailable("neo4j away", cause="ServiceUnavailable")

    sizes: list[int] = []
    group = GroupRead(counted(away, sizes), max_batch=64, linger_s=0.5, wait_s=30)
    states = save_all([partial(group.write_state, user, progress_key(user, str(i)), str(i)) for i in range(4)])
    assert all(isinstance(s, StoreUnavailable) and s.cause == "ServiceUnavailable" for s in states)
    assert sizes == [4]  # one query for the four, not read again one by one (a retry is its task's)
    assert len({id(s) for s in states}) == 4  # each caller raises its own copy


def test_a_stalled_read_fails_its_callers_after_the_wait_and_the_next_reads_are_answered_meanwhile(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("stall")
    release = threading.Event()

    def stalling(requests: Sequence[StateRequest]) -> list[WriteState]:
        if any(r.episode_id == "stuck" for r in requests):
            release.wait(60)
        return store.write_states(requests)

    group = GroupRead(stalling, max_batch=64, linger_s=0.01, wait_s=0.5, stuck_s=0.3)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="did not finish in time"):
            group.write_state(user, progress_key(user, "s"), "stuck")
        assert time.monotonic() - started < 5
        # still stuck: a new reader answers the next reads (before, every read of the process failed)
        states = save_all([partial(group.write_state, user, progress_key(user, "s"), f"next{i}") for i in range(3)])
        assert all(isinstance(s, WriteState) and s.line is None for s in states)
        assert not release.is_set()
    finally:
        release.set()


def test_reads_held_back_by_a_stuck_reader_are_answered_by_the_next_one(
    store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("held")
    release = threading.Event()

    def stalling(requests: Sequence[StateRequest]) -> list[WriteState]:
        if any(r.episode_id == "stuck" for r in requests):
            release.wait(60)
        return store.write_states(requests)

    group = GroupRead(stalling, max_batch=2, linger_s=0.3, wait_s=4, stuck_s=0.3)
    ask = partial(group.write_state, user, progress_key(user, "s"))
    try:
        # "stuck" first, so the reader's batch is it and "a" (at most two); "b" waits for the next reader
        states = save_all([partial(ask, "stuck"), partial(ask, "a"), partial(ask, "b")], apart_s=0.05)
        assert not release.is_set()
        assert isinstance(states[0], StoreUnavailable) and isinstance(states[1], StoreUnavailable)
        assert isinstance(states[2], WriteState)  # started by b's own caller, while the first is stuck
    finally:
        release.set()


def test_without_a_wait_each_read_is_its_callers_own(store: Neo4jGraphStore, new_user: Callable[[str], str]) -> None:
    user = new_user("alone")
    sizes: list[int] = []
    group = GroupRead(counted(store.write_states, sizes), max_batch=64, linger_s=0, wait_s=30)
    states = save_all([partial(group.write_state, user, progress_key(user, str(i)), str(i)) for i in range(6)])
    assert all(isinstance(s, WriteState) for s in states) and sizes == [1] * 6
