"""Which unacknowledged messages the sweep gives back (worker/liveness.py), on real Redis with kombu's own
key layout: never those of a live worker, those of a lost one only once its silence is confirmed, all of
them however long the list of old messages is."""

from __future__ import annotations

import time

import pytest
import redis

from tests.services import RedisClient
from worker import keys
from worker.liveness import CONFIRM_S, Holder, orphans, restore_orphans

OLD = 60.0  # seconds since delivery: older than the dead-after time of 30 s


def delivered(redis: RedisClient, tag: str, age_s: float) -> None:
    """What kombu writes when a worker receives a message."""
    redis.zadd(keys.KOMBU_UNACKED_INDEX, {tag: time.time() - age_s})
    redis.hset(keys.KOMBU_UNACKED, tag, '[{}, "", "memory.extract"]')


def test_old_messages_of_live_workers_stay_and_those_of_a_lost_worker_go_once_its_silence_is_confirmed(
    clean_redis: RedisClient,
) -> None:
    live, lost = Holder(clean_redis, 30), Holder(clean_redis, 30)
    for tag, holder in (("t-live", live), ("t-lost", lost)):
        delivered(clean_redis, tag, OLD)
        holder.hold(tag)
        holder.beat()
    # A beat renews the time of what its worker holds: kombu's visibility timeout never takes it from them.
    assert (clean_redis.zscore(keys.KOMBU_UNACKED_INDEX, "t-live") or 0.0) > time.time() - 5
    delivered(clean_redis, "t-nobody", OLD)  # received by a worker that died before noting it
    delivered(clean_redis, "t-young", 1.0)  # just received: its worker may be noting it right now
    assert orphans(clean_redis, 30) == (["t-nobody"], [])
    delivered(clean_redis, "t-lost", OLD)  # its worker's last beat was long ago (as when its key expires)
    live.beat()
    assert orphans(clean_redis, 30) == (["t-nobody"], [])  # t-live renewed again by its beat
    clean_redis.delete(keys.worker_alive(lost.id))  # its key expired: suspected, not yet taken for dead
    assert orphans(clean_redis, 30) == (["t-nobody"], [])
    clean_redis.set(keys.worker_suspect(lost.id), repr(time.time() - CONFIRM_S - 1))  # still silent since
    found, dead = orphans(clean_redis, 30)
    assert sorted(found) == ["t-lost", "t-nobody"] and dead == [lost.id]
    restored: list[str] = []
    assert restore_orphans(clean_redis, restored.extend, 30) == 2
    assert sorted(restored) == ["t-lost", "t-nobody"]
    assert not clean_redis.sismember(keys.WORKERS, lost.id) and not clean_redis.exists(keys.worker_held(lost.id))
    assert clean_redis.sismember(keys.WORKERS, live.id) and clean_redis.sismember(keys.worker_held(live.id), "t-live")


def test_a_suspected_worker_that_beats_again_is_not_taken_for_dead(clean_redis: RedisClient) -> None:
    """After a Redis outage every liveness key has expired at once; the workers' next beats clear it."""
    holder = Holder(clean_redis, 30)
    delivered(clean_redis, "t1", OLD)
    holder.hold("t1")
    holder.beat()
    clean_redis.delete(keys.worker_alive(holder.id))
    assert orphans(clean_redis, 30) == ([], [])  # suspected
    holder.beat()  # back
    clean_redis.set(keys.worker_suspect(holder.id), repr(time.time() - 3600))  # even an old suspicion...
    holder.beat()  # ...is cleared by a beat
    assert orphans(clean_redis, 30) == ([], [])


def test_a_long_list_of_old_held_messages_does_not_hide_a_lost_one(clean_redis: RedisClient) -> None:
    holder = Holder(clean_redis, 30)
    pipe = clean_redis.pipeline()
    for i in range(2500):  # retries of a live worker waiting out an LLM outage, all older than the lost one
        pipe.zadd(keys.KOMBU_UNACKED_INDEX, {f"held-{i}": time.time() - 3000})
        pipe.hset(keys.KOMBU_UNACKED, f"held-{i}", "[]")
        pipe.sadd(keys.worker_held(holder.id), f"held-{i}")
    pipe.execute()
    holder.beat()
    delivered(clean_redis, "t-lost", OLD)
    assert orphans(clean_redis, 30) == (["t-lost"], [])


def test_received_messages_are_noted_as_held_within_a_moment_without_waiting_for_a_beat(
    clean_redis: RedisClient,
) -> None:
    holder = Holder(clean_redis, 30)
    holder.start()
    try:
        for tag in ("t1", "t2", "t3"):
            holder.hold(tag)
        deadline = time.monotonic() + 1.0
        while clean_redis.scard(keys.worker_held(holder.id)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        held = {t.decode() for t in clean_redis.smembers(keys.worker_held(holder.id))}
        assert held == {"t1", "t2", "t3"}  # well before the next beat, and before any message is old enough
        for tag in ("t1", "t2", "t3"):
            delivered(clean_redis, tag, OLD)
        assert orphans(clean_redis, 30) == ([], [])
    finally:
        holder.stop()
    assert not clean_redis.exists(keys.worker_held(holder.id))  # a clean exit withdraws the set


def test_noting_a_message_as_held_makes_no_round_trip_on_the_consuming_thread() -> None:
    """Redis unreachable: hold() still returns at once (the heartbeat thread writes, and logs its failure)."""
    unreachable = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    try:
        holder = Holder(unreachable, 30)
        holder.hold("t1")  # a write on this thread would raise ConnectionError here
        holder.hold("t2")
        with pytest.raises(redis.ConnectionError):  # the heartbeat thread's write is the one that meets Redis
            holder.write_held()
    finally:
        unreachable.close()


def test_two_sweeps_at_once_restore_a_lost_message_once(clean_redis: RedisClient) -> None:
    """Issue 33 item 8: the second of two sweeps at once would restore the message again after a new worker
    received it (same delivery tag), taking it from that worker and pushing it a second time."""
    import threading

    delivered(clean_redis, "t-orphan", OLD)
    restored: list[str] = []

    def slow_restore(tags: list[str]) -> None:
        time.sleep(0.5)  # kombu's restore, one transaction per tag; the other sweep runs meanwhile
        restored.extend(tags)

    sweeps = [threading.Thread(target=restore_orphans, args=(clean_redis, slow_restore, 30)) for _ in range(2)]
    for sweep in sweeps:
        sweep.start()
    for sweep in sweeps:
        sweep.join(10)
    assert restored == ["t-orphan"]
    assert not clean_redis.exists(keys.LIVENESS_SWEEP_LOCK)  # released: the next sweep runs
    assert restore_orphans(clean_redis, restored.extend, 30) == 1
