"""Acknowledgements reach Redis in batches (worker/kombu_acks.py), every one of them, and those still waiting
go out when the channel closes; Celery's line per task received and succeeded is logged only when asked for."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from kombu.connection import Connection as KombuConnection
from kombu.messaging import Producer as KombuProducer

from api_stub.client import MemoryClient
from tests.ingest_helpers import wait_until
from tests.redis_monitor import monitored
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker.keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX
from worker.kombu_acks import batch_acks, batch_of
from worker.settings import Settings

QUEUE = "test.acks"
Connection: Any = KombuConnection  # kombu has no type hints
Producer: Any = KombuProducer


def _delivered(connection: Any, n: int) -> list[Any]:
    """n messages published to QUEUE and taken from it unacknowledged (kombu keeps them in `unacked`)."""
    channel = connection.default_channel
    producer = Producer(channel)
    for i in range(n):
        producer.publish({"n": i}, exchange="", routing_key=QUEUE)
    messages = [channel.basic_get(QUEUE, no_ack=False) for _ in range(n)]
    assert all(m is not None for m in messages)
    return messages


@pytest.fixture
def batching(settings: Settings) -> Iterator[Callable[[float], Any]]:
    """Connections whose channel gathers its acknowledgements for wait_s (the patch applied as the worker's
    app applies it); each released when the test ends, whatever became of it."""
    opened: list[Any] = []

    def connect(wait_s: float) -> Any:
        batch_acks(settings.ack_batch_ms)
        connection = Connection(settings.redis_url)
        opened.append(connection)
        batch_of(connection.default_channel.qos, wait_s)
        return connection

    yield connect
    for connection in opened:
        connection.release()


def test_acknowledgements_reach_redis_together_and_all_of_them(settings: Settings, clean_redis: RedisClient) -> None:
    batch_acks(settings.ack_batch_ms)  # as the worker's app does when configured
    with Connection(settings.redis_url) as connection:
        messages = _delivered(connection, 200)
        tags = {str(m.delivery_tag) for m in messages}
        assert {t.decode() for t in clean_redis.hkeys(KOMBU_UNACKED)} == tags
        with monitored(clean_redis) as seen:
            for message in messages:
                message.ack()
            wait_until(lambda: clean_redis.hlen(KOMBU_UNACKED) == 0, 10, "the acknowledgements removed from Redis")
        removals = [c for c in seen if c.startswith("HDEL") and KOMBU_UNACKED in c]
        removed = [tag for c in removals for tag in tags if tag in c]
        assert sorted(removed) == sorted(tags)  # each once
        assert len(removals) <= 10, f"{len(removals)} round trips for 200 acknowledgements"
        assert clean_redis.llen(QUEUE) == 0


def test_acknowledgements_still_waiting_go_out_when_the_channel_closes(
    batching: Callable[[float], Any], clean_redis: RedisClient
) -> None:
    connection = batching(3600.0)  # this channel's acknowledgements wait far longer than the test
    messages = _delivered(connection, 20)
    for message in messages:
        message.ack()
    time.sleep(0.1)
    assert clean_redis.hlen(KOMBU_UNACKED) == 20  # acknowledged; their removal from Redis waits
    connection.release()  # closes the channel, as a warm shutdown or a lost connection does
    assert clean_redis.hlen(KOMBU_UNACKED) == 0
    assert clean_redis.llen(QUEUE) == 0  # removed, not restored to the queue as unacknowledged ones are


def test_a_close_during_a_round_trip_sends_what_that_round_trip_could_not(
    batching: Callable[[float], Any], clean_redis: RedisClient, caplog: pytest.LogCaptureFixture
) -> None:
    connection = batching(0.2)
    messages = _delivered(connection, 5)
    clean_redis.execute_command("CLIENT", "PAUSE", 1500, "WRITE")  # the batch's round trip will hang
    try:
        with caplog.at_level("WARNING", logger="memory.acks"):
            for message in messages:
                message.ack()  # the channel's own bookkeeping: no write to Redis
            time.sleep(0.5)  # the removal went out after 0.2 s and hangs
            connection.release()  # closes the channel and its connections while the removal is under way
        assert "acknowledgements not sent" in caplog.text  # the round trip under way was cut by the close
        assert clean_redis.hlen(KOMBU_UNACKED) == 0  # and what it carried was sent again
        assert clean_redis.zcard(KOMBU_UNACKED_INDEX) == 0
    finally:
        clean_redis.execute_command("CLIENT", "UNPAUSE")


def test_a_failed_round_trip_is_tried_again(
    batching: Callable[[float], Any], clean_redis: RedisClient, caplog: pytest.LogCaptureFixture
) -> None:
    connection = batching(0.2)
    messages = _delivered(connection, 5)
    held = clean_redis.zrange(KOMBU_UNACKED_INDEX, 0, -1, withscores=True)
    index: Mapping[str | bytes, bytes | float | int | str] = {tag.decode(): at for tag, at in held}
    assert len(index) == 5
    clean_redis.delete(KOMBU_UNACKED_INDEX)
    clean_redis.set(KOMBU_UNACKED_INDEX, "not a sorted set")  # the next removal is refused (WRONGTYPE)
    with caplog.at_level("WARNING", logger="memory.acks"):
        for message in messages:
            message.ack()
        wait_until(lambda: "acknowledgements not sent" in caplog.text, 10, "the warning of a refused removal")
        clean_redis.delete(KOMBU_UNACKED_INDEX)
        clean_redis.zadd(KOMBU_UNACKED_INDEX, index)
        wait_until(lambda: clean_redis.zcard(KOMBU_UNACKED_INDEX) == 0, 10, "the removal tried again")
    assert clean_redis.hlen(KOMBU_UNACKED) == 0
    connection.release()


def _said(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"I planted {i} tulips along the fence this spring."}]


def test_no_log_line_per_task_unless_asked_and_acknowledged_while_running(
    clean_redis: RedisClient,
    workers: Callable[..., WorkerProcess],
    client: MemoryClient,
    new_user: Callable[[str], str],
) -> None:
    user = new_user("tasklines")
    quiet = workers()
    receipt = client.add_episode(user, "quiet", _said(1))
    assert client.wait([receipt], 60)[0].state == "persisted"
    wait_until(lambda: clean_redis.hlen(KOMBU_UNACKED) == 0, 10, "the worker's acknowledgement removed from Redis")
    quiet.stop()
    text = quiet.log_path.read_text(errors="replace")
    assert " ready." in text
    assert "] received" not in text and "] succeeded in" not in text

    loud = workers(MEMORY_TASK_LOG_LINES="true")
    receipt = client.add_episode(user, "loud", _said(2))
    assert client.wait([receipt], 60)[0].state == "persisted"
    loud.stop()
    text = loud.log_path.read_text(errors="replace")
    assert "memory.extract_episode[" in text and "] received" in text and "] succeeded in" in text
