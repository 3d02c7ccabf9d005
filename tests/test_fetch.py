"""A busy queue is taken in batches (worker/kombu_fetch.py): each message delivered once, recorded in kombu's
`unacked` hash as kombu records it (without kombu's own round trip), never more than the prefetch, and given
back when its channel closes unacknowledged; what the batch cannot read, or kombu cannot decode, goes back to
the head of its queue with what follows it; a refused delivery gives the rest of its batch back and its error
goes on; a consumer without acknowledgements keeps kombu's own path; a real worker takes a backlog with few
round trips."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from kombu.connection import Connection as KombuConnection
from kombu.messaging import Consumer as KombuConsumer
from kombu.messaging import Producer as KombuProducer
from kombu.messaging import Queue as KombuQueue

from api_stub.client import MemoryClient
from tests.redis_monitor import monitored
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker.keys import EXTRACT_QUEUE, KOMBU_UNACKED, KOMBU_UNACKED_INDEX
from worker.kombu_fetch import TAKE, _State, batch_fetch, take_more
from worker.settings import Settings

QUEUE = "test.fetch"
PREFETCH = 64
Connection: Any = KombuConnection  # kombu has no type hints
Consumer: Any = KombuConsumer
Producer: Any = KombuProducer
Queue: Any = KombuQueue


@pytest.fixture
def connection(settings: Settings) -> Iterator[Any]:
    """A kombu connection whose channels take batches (the patch applied as the worker's app applies it, with
    the settings' batch); released when the test ends, whatever became of it."""
    assert settings.fetch_batch > 1
    batch_fetch(settings.fetch_batch)
    opened = Connection(settings.redis_url)
    yield opened
    opened.release()


def _publish(connection: Any, n: int) -> None:
    producer = Producer(connection.default_channel)
    for i in range(n):
        producer.publish({"n": i}, exchange="", routing_key=QUEUE)


def _consume(
    connection: Any,
    enough: Callable[[list[Any]], bool],
    *,
    got: list[Any] | None = None,
    ack: bool = False,
    no_ack: bool = False,
    on_message: Callable[[list[Any]], None] = lambda got: None,
) -> list[Any]:
    """What a consumer of QUEUE (prefetch PREFETCH) receives (into `got`) until `enough` holds or nothing more
    comes."""
    channel = connection.channel()
    channel.basic_qos(0, PREFETCH, False)
    got = [] if got is None else got

    def received(body: Any, message: Any) -> None:
        got.append(message)
        if ack:
            message.ack()
        on_message(got)

    with Consumer(channel, [Queue(QUEUE, routing_key=QUEUE)], callbacks=[received], no_ack=no_ack):
        while not enough(got):
            try:
                connection.drain_events(timeout=1)
            except TimeoutError:
                break
    return got


def _numbers(messages: list[Any]) -> list[int]:
    return sorted(int(m.payload["n"]) for m in messages)


def test_a_busy_queue_is_taken_in_batches_each_message_once(connection: Any, clean_redis: RedisClient) -> None:
    _publish(connection, 100)
    with monitored(clean_redis) as seen:
        got = _consume(connection, lambda got: len(got) >= 100, ack=True)
    assert _numbers(got) == list(range(100))
    brpops = [c for c in seen if c.startswith("BRPOP")]
    assert len(brpops) <= 20, f"{len(brpops)} BRPOPs for 100 messages"
    # kombu records the message each BRPOP took (MULTI, ZADD, HSET, EXEC); the script recorded the others
    own = [c for c in seen if c.startswith("HSET") and KOMBU_UNACKED in c]
    scripted = [c for c in seen if c.startswith(f"[lua] HSET {KOMBU_UNACKED}")]
    assert len(own) <= len(brpops) and len(own) + len(scripted) == 100


def test_taken_messages_are_recorded_as_kombu_records_them_and_come_back_unacknowledged(
    connection: Any, clean_redis: RedisClient
) -> None:
    _publish(connection, 100)
    got = _consume(connection, lambda got: False)  # never acknowledged: until nothing more comes
    assert len(got) == PREFETCH  # never more than the prefetch
    held = clean_redis.hgetall(KOMBU_UNACKED)
    assert set(held) == {m.delivery_tag.encode() for m in got}
    assert clean_redis.zcard(KOMBU_UNACKED_INDEX) == len(got)
    for message in got:  # kombu's own record: [payload, exchange, routing key]
        info = message.delivery_info
        assert json.loads(held[message.delivery_tag.encode()]) == [message._raw, info["exchange"], info["routing_key"]]
    connection.release()  # closes the channel, as a warm shutdown or a lost connection does
    assert clean_redis.llen(QUEUE) == 100  # every one back
    assert clean_redis.hlen(KOMBU_UNACKED) == 0


def test_a_message_the_script_cannot_read_stays_in_its_queue(clean_redis: RedisClient) -> None:
    take = clean_redis.register_script(TAKE)
    good = [
        json.dumps(
            {
                "body": "",
                "properties": {"delivery_tag": f"tag-{i}", "delivery_info": {"exchange": "", "routing_key": QUEUE}},
            }
        )
        for i in range(3)
    ]
    clean_redis.rpush(QUEUE, good[2], "not a kombu message", good[1], good[0])  # taken from the right end
    taken = take(keys=[KOMBU_UNACKED_INDEX, KOMBU_UNACKED, QUEUE], args=[10, time.time()])
    assert taken == [QUEUE.encode(), b"tag-0", good[0].encode(), QUEUE.encode(), b"tag-1", good[1].encode()]
    assert clean_redis.lrange(QUEUE, 0, -1) == [good[2].encode(), b"not a kombu message"]  # where it was
    assert set(clean_redis.hkeys(KOMBU_UNACKED)) == {b"tag-0", b"tag-1"}

    clean_redis.delete(KOMBU_UNACKED_INDEX)
    clean_redis.set(KOMBU_UNACKED_INDEX, "not a sorted set")
    clean_redis.rpush(QUEUE, good[2])
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):  # refused before anything is taken
        take(keys=[KOMBU_UNACKED_INDEX, KOMBU_UNACKED, QUEUE], args=[10, time.time()])
    assert clean_redis.llen(QUEUE) == 3


def test_a_message_kombu_cannot_decode_goes_back_with_what_follows_it(
    connection: Any, clean_redis: RedisClient, caplog: pytest.LogCaptureFixture
) -> None:
    _publish(connection, 3)
    first, second, third = (json.loads(item) for item in reversed(clean_redis.lrange(QUEUE, 0, -1)))
    undecodable = {**third, "headers": {"x": {"__type__": "from a newer kombu", "__value__": 1}}}
    undecodable["properties"] = {**third["properties"], "delivery_tag": "undecodable"}
    clean_redis.delete(QUEUE)
    # taken from the right end: first (by BRPOP), second, the undecodable one, third
    clean_redis.rpush(QUEUE, json.dumps(third), json.dumps(undecodable), json.dumps(second), json.dumps(first))
    with caplog.at_level("ERROR", logger="memory.fetch"):
        got = _consume(connection, lambda got: len(got) >= 2)
    assert "unreadable; given back" in caplog.text
    assert _numbers(got) == [0, 1]
    assert set(clean_redis.hkeys(KOMBU_UNACKED)) == {m.delivery_tag.encode() for m in got}
    assert [json.loads(item) for item in clean_redis.lrange(QUEUE, 0, -1)] == [third, undecodable]  # head last


def test_a_refused_delivery_gives_the_rest_of_its_batch_back_in_order_and_its_error_goes_on(
    connection: Any, clean_redis: RedisClient
) -> None:
    _publish(connection, 40)

    def refuse_third(got: list[Any]) -> None:
        if len(got) == 3:  # the second of the batch taken after the first message's BRPOP
            raise RuntimeError("the consumer refused it")

    got: list[Any] = []
    with pytest.raises(RuntimeError, match="refused"):  # as on kombu's own path: the consumer sees the error
        _consume(connection, lambda got: len(got) >= 3, got=got, on_message=refuse_third)
    assert _numbers(got) == [0, 1, 2]
    assert clean_redis.hlen(KOMBU_UNACKED) == 3  # the refused one is the channel's, as kombu would hold it
    assert clean_redis.llen(QUEUE) == 37
    channel = connection.default_channel
    following = [channel.basic_get(QUEUE, no_ack=True) for _ in range(3)]
    assert [m.payload["n"] for m in following] == [3, 4, 5]  # the head of the queue, in their order
    assert not any(m.delivery_info.get("redelivered") for m in following)  # never delivered before


def test_a_consumer_without_acknowledgements_leaves_nothing_in_unacked(
    connection: Any, clean_redis: RedisClient
) -> None:
    _publish(connection, 30)
    got = _consume(connection, lambda got: len(got) >= 30, no_ack=True)
    assert _numbers(got) == list(range(30))
    assert clean_redis.hlen(KOMBU_UNACKED) == 0


def test_a_script_redis_refuses_leaves_every_channel_on_kombus_path_for_a_while(
    connection: Any, clean_redis: RedisClient, caplog: pytest.LogCaptureFixture
) -> None:
    _publish(connection, 10)
    channel = connection.channel()
    channel.basic_qos(0, PREFETCH, False)
    clean_redis.set(KOMBU_UNACKED_INDEX, "not a sorted set")  # the script refuses to run (WRONGTYPE)
    try:
        with Consumer(channel, [Queue(QUEUE, routing_key=QUEUE)], callbacks=[lambda body, message: None]):
            with caplog.at_level("ERROR", logger="memory.fetch"):
                assert take_more(channel, 16) == 0
            assert "Redis refused the batch script" in caplog.text
            assert clean_redis.llen(QUEUE) == 10  # nothing taken
            clean_redis.delete(KOMBU_UNACKED_INDEX)
            assert take_more(channel, 16) == 0  # paused: one message per round trip, as kombu takes them
            _State.paused_until = float("-inf")
            assert take_more(channel, 16) == 10
    finally:
        _State.paused_until = float("-inf")
    assert clean_redis.hlen(KOMBU_UNACKED) == 10


def test_a_worker_takes_a_backlog_in_batches(
    clean_redis: RedisClient,
    workers: Callable[..., WorkerProcess],
    client: MemoryClient,
    new_user: Callable[[str], str],
) -> None:
    user = new_user("fetch")
    receipts = [
        client.add_episode(user, f"s{i}", [{"role": "user", "content": f"My locker number is {i}."}])
        for i in range(200)
    ]
    with monitored(clean_redis) as seen:
        workers()
        assert {o.state for o in client.wait(receipts, 120)} == {"persisted"}
    brpops = [c for c in seen if c.startswith("BRPOP") and EXTRACT_QUEUE in c]
    assert len(brpops) < 100, f"{len(brpops)} BRPOPs for 200 episodes"  # kombu's own: one each
    assert clean_redis.llen(EXTRACT_QUEUE) == 0
