"""Backpressure: beyond MEMORY_MAX_IN_FLIGHT accepted-but-unfinished episodes, new ones are refused clearly
(QueueFull; HTTP 503 with Retry-After) and nothing of them is enqueued, instead of Redis filling up."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from api_stub.client import MemoryClient
from api_stub.http_app import create_app
from tests.services import RedisClient
from worker.errors import QueueFull
from worker.inflight import InFlight
from worker.keys import EXTRACT_QUEUE
from worker.settings import Settings

SAID = [{"role": "user", "content": "I started learning the cello."}]


def test_episodes_beyond_the_in_flight_limit_are_refused_and_nothing_is_enqueued(
    settings: Settings, clean_redis: RedisClient, new_user: Callable[[str], str]
) -> None:
    client = MemoryClient(settings.model_copy(update={"max_in_flight": 3}))
    user = new_user("full")
    try:
        for i in range(3):  # no worker: they stay in flight
            client.add_episode(user, f"s{i}", SAID)
        with pytest.raises(QueueFull) as info:
            client.add_episode(user, "s3", SAID)
        assert (info.value.in_flight, info.value.limit) == (3, 3)
        batch = [{"user_id": user, "session_id": f"b{i}", "messages": SAID} for i in range(2)]
        with pytest.raises(QueueFull):
            client.add_episodes(batch)  # all or nothing, as for invalid input
        assert InFlight(clean_redis).count() == 3 and clean_redis.llen(EXTRACT_QUEUE) == 3
    finally:
        client.close()


def test_over_http_a_full_queue_is_a_503_with_retry_after(
    settings: Settings, clean_redis: RedisClient, new_user: Callable[[str], str]
) -> None:
    limited = settings.model_copy(update={"max_in_flight": 1, "http_auth_disabled": True, "http_token": None})
    with TestClient(create_app(limited)) as http:
        body = {"user_id": new_user("full-http"), "session_id": "s", "messages": SAID}
        assert http.post("/v1/episodes", json=body).status_code == 202
        refused = http.post("/v1/episodes", json={**body, "session_id": "t"})
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
    assert refused.json()["error"] == "queue_full"
    assert clean_redis.llen(EXTRACT_QUEUE) == 1
