"""A write that waits on a lock (or a stalled server) gives up after the transaction timeout, with a
transient error the stage retries, instead of holding a persist thread forever."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from tests.factories import entities, record
from worker.errors import StoreUnavailable
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.identity import user_tag
from worker.settings import Settings


def test_a_persist_blocked_by_a_held_lock_times_out_as_a_transient_error(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("locked")
    store.save_episode(record(user, "first, so the user's mark exists"), entities("Anna"), [])
    impatient = Neo4jGraphStore.from_settings(settings.model_copy(update={"neo4j_tx_timeout_s": 2.0}))
    outcome: list[BaseException | bool] = []

    def persist() -> None:
        try:
            outcome.append(impatient.save_episode(record(user, "waits on the lock"), entities("Anna"), []).created)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    holder = store._driver.session(database=settings.neo4j_database)
    tx = holder.begin_transaction()
    try:
        tx.run("MATCH (u:UserMark {user_tag: $tag}) SET u.held = true", tag=user_tag(user)).consume()
        worker = threading.Thread(target=persist)
        worker.start()
        worker.join(30)  # far longer than the timeout, far shorter than "forever"
        assert not worker.is_alive(), "the persist transaction was still waiting on the lock"
    finally:
        tx.rollback()
        holder.close()
        impatient.close()
    [error] = outcome
    assert isinstance(error, StoreUnavailable) and error.transient, error
    assert store.stats(user).episodes == 1
    # The lock released, the same write goes through.
    assert store.save_episode(record(user, "after the lock"), entities("Anna"), []).created


def test_the_timeout_is_a_setting_with_a_sane_default() -> None:
    assert Settings.load().neo4j_tx_timeout_s == 30.0
    with pytest.raises(Exception, match=r"(?i)neo4j_tx_timeout_s"):
        Settings.load(neo4j_tx_timeout_s=0)
