"""With Neo4j stopped the store says so quickly and with the project's own error; after a restart it works."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.factories import entities, record
from tests.services import services
from worker.errors import StoreUnavailable
from worker.graph.neo4j_store import Neo4jGraphStore


@pytest.mark.usefixtures("neo4j_restorer")
def test_neo4j_stopped_then_started(store: Neo4jGraphStore, new_user: Callable[[str], str]) -> None:
    user = new_user("outage")
    store.save_episode(record(user, "before the outage"), entities("Before"), [])

    services("down", "neo4j")
    started = time.monotonic()
    assert store.is_available(timeout_s=2) is False
    assert time.monotonic() - started < 2.0
    with pytest.raises(StoreUnavailable) as info:
        store.save_episode(record(user, "during the outage"), entities("During"), [])
    assert info.value.transient and info.value.cause

    services("up", "neo4j")
    assert store.is_available(timeout_s=2) is True
    assert store.save_episode(record(user, "after the outage"), entities("After"), []).created
    assert store.stats(user).episodes == 2
