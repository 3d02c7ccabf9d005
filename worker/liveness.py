"""Which worker holds which unacknowledged message, so that what a crashed worker held comes back in seconds,
not at the broker's visibility timeout (an hour by default).

kombu's Redis transport keeps every message a worker received and has not acknowledged in the `unacked` hash
(and its time in `unacked_index`); it hands such a message out again only after the visibility timeout, which
must outlast the longest retry countdown, so it is long. Here each Celery worker process:
- notes the delivery tag of every message it receives (`task_received`, retries waiting for their countdown
  included) in a set of its own, `memory:worker:held:<holder>`: its heartbeat thread writes the tags received
  within FLUSH_S in one SADD, so the consumer loop that receives them makes no round trip for it;
- every HEARTBEAT_S renews its liveness key `memory:worker:alive:<holder>` (expiry: the dead-after setting,
  kept by Redis, so clocks do not matter), re-writes the set from what it still holds (a tag no longer
  in `unacked` was acknowledged), and renews those messages' time in `unacked_index`: kombu's visibility
  timeout then never hands out a message a live worker is still working on (an attempt longer than it, on a
  slow model or a busy machine, was run twice and the model paid twice); the age the sweep below goes by
  counts from the holder's last beat.

The sweep (`memctl worker`, every MEMORY_SWEEP_INTERVAL_S) then moves back to its queue, with kombu's own
restore, every unacknowledged message older than the dead-after time that no live worker holds: the
original message, with its retry count and countdown, taken out of `unacked` in the same transaction, so it
cannot also come back at the visibility timeout. A message received by a live worker is in its set within
milliseconds; the age condition covers that instant. A worker whose key expired is first only suspected and
its messages are left alone until it has stayed silent CONFIRM_S more (a Redis restart after an outage
expires every key at once; the workers' next beats, within 5 s, clear the suspicion). Stages are idempotent,
so a worker wrongly taken for dead (a pause longer than the dead-after time) costs a second run of a stage,
never a double count. Every worker must run this code: one without it (a rolling deploy from an older
version) has its messages restored after the dead-after time and run twice. The age of a message is the
receiving worker's clock (kombu's `unacked_index`): keep hosts in NTP sync.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from worker import keys

log = logging.getLogger("memory.liveness")

HEARTBEAT_S = 5.0
FLUSH_S = 0.05  # tags received within this are noted together (far below the dead-after age of a message)
CONFIRM_S = 2 * HEARTBEAT_S  # a suspected worker is taken for dead only when silent this much longer
PAGE = 1000
HELD_TTL_S = 86_400  # a set outlives its worker only until the sweep clears it, or a day


class Holder:
    """One worker process's side: its id, the tags it holds, its heartbeat."""

    def __init__(self, redis: Any, dead_after_s: int) -> None:
        self.id = f"{socket.gethostname()}:{uuid.uuid4().hex[:12]}"
        self._redis = redis
        self._dead_after_s = dead_after_s
        self._tags: set[str] = set()
        self._unwritten: list[str] = []  # received, not yet in the held set
        self._lock = threading.Lock()
        self._received = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, tag: str) -> None:
        """Note a received message as held (written by the heartbeat thread within FLUSH_S)."""
        with self._lock:
            self._tags.add(tag)
            self._unwritten.append(tag)
        self._received.set()

    def write_held(self) -> None:
        """Write the tags received since the last write, in one round trip."""
        self._received.clear()
        with self._lock:
            tags, self._unwritten = self._unwritten, []
        if tags and not self._stopped.is_set():  # once stopped, the set is withdrawn: a late write would outlive it
            pipe = self._redis.pipeline(transaction=True)
            pipe.sadd(keys.worker_held(self.id), *tags)
            pipe.expire(keys.worker_held(self.id), HELD_TTL_S)  # never a set without an end
            pipe.execute()

    def beat(self) -> None:
        with self._lock:
            tags = sorted(self._tags)
        check = self._redis.pipeline(transaction=False)
        for tag in tags:
            check.hexists(keys.KOMBU_UNACKED, tag)
        gone = [tag for tag, present in zip(tags, check.execute(), strict=True) if not present]
        with self._lock:
            self._tags.difference_update(gone)
            held = sorted(self._tags)
            self._unwritten = []  # all written below
        if self._stopped.is_set():  # stop() withdraws this worker: no late beat says it is alive again
            return
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(keys.worker_alive(self.id), "1", ex=self._dead_after_s)
        pipe.delete(keys.worker_suspect(self.id))
        pipe.sadd(keys.WORKERS, self.id)
        if gone:
            pipe.srem(keys.worker_held(self.id), *gone)
        if held:
            pipe.sadd(keys.worker_held(self.id), *held)
            # What a live worker holds is never past the visibility timeout: kombu would hand a message still
            # being worked on (a slow model, a busy machine) to a second worker, and the model is paid twice.
            # XX: a message acknowledged meanwhile is not put back in the index.
            pipe.zadd(keys.KOMBU_UNACKED_INDEX, dict.fromkeys(held, time.time()), xx=True)
        pipe.expire(keys.worker_held(self.id), HELD_TTL_S)
        pipe.execute()

    def start(self) -> None:
        try:
            self.beat()
        except Exception as exc:  # Redis away: the heartbeat thread keeps trying
            log.warning("heartbeat failed", extra={"error_class": type(exc).__name__})
        self._thread = threading.Thread(target=self._run, name="memory-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_beat = time.monotonic() + HEARTBEAT_S
        while not self._stopped.is_set():
            if self._received.wait(max(0.0, next_beat - time.monotonic())) and not self._stopped.is_set():
                time.sleep(FLUSH_S)  # the tags received meanwhile go in the same write
                if self._stopped.is_set():
                    break
                try:
                    self.write_held()
                except Exception as exc:  # the next beat writes them all
                    log.warning("held tags not recorded", extra={"error_class": type(exc).__name__})
            if time.monotonic() >= next_beat and not self._stopped.is_set():
                next_beat = time.monotonic() + HEARTBEAT_S
                try:
                    self.beat()
                except Exception as exc:  # Redis away for a moment: the next beat tries again
                    log.warning("heartbeat failed", extra={"error_class": type(exc).__name__})

    def stop(self) -> None:
        """A clean exit: kombu gives back what this worker held when it closes its channel."""
        self._stopped.set()
        self._received.set()  # wakes the heartbeat thread
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * FLUSH_S + 5)  # its last write lands before the set is withdrawn
        try:
            pipe = self._redis.pipeline(transaction=True)
            pipe.delete(keys.worker_alive(self.id), keys.worker_held(self.id))
            pipe.srem(keys.WORKERS, self.id)
            pipe.execute()
        except Exception as exc:
            log.warning("heartbeat not withdrawn", extra={"error_class": type(exc).__name__})


def orphans(redis: Any, older_than_s: float) -> tuple[list[str], list[str]]:
    """(unacknowledged tags older than older_than_s that no live or merely suspected worker holds, holders
    confirmed dead). Reads kombu's index in pages, so a long list of old messages held by live workers
    (retries waiting out an LLM outage) cannot hide a lost worker's newer ones."""
    holders = sorted(h.decode() if isinstance(h, bytes) else h for h in redis.smembers(keys.WORKERS))
    now = time.time()
    check = redis.pipeline(transaction=False)
    for holder in holders:
        check.exists(keys.worker_alive(holder))
    alive = [h for h, up in zip(holders, check.execute(), strict=True) if up]
    silent = [h for h in holders if h not in alive]
    suspect = redis.pipeline(transaction=False)
    for holder in silent:
        suspect.set(keys.worker_suspect(holder), repr(now), nx=True, ex=3600)
        suspect.get(keys.worker_suspect(holder))
    since = suspect.execute()[1::2]
    dead = [h for h, at in zip(silent, since, strict=True) if at is not None and now - float(at) >= CONFIRM_S]
    spared = [h for h in holders if h not in dead]  # alive, or suspected and not confirmed yet
    held: set[str] = set()
    if spared:
        held = {t.decode() if isinstance(t, bytes) else t for t in redis.sunion([keys.worker_held(h) for h in spared])}
    found: list[str] = []
    start = 0
    while True:
        page = redis.zrangebyscore(keys.KOMBU_UNACKED_INDEX, "-inf", now - older_than_s, start=start, num=PAGE)
        found += [t for t in (p.decode() if isinstance(p, bytes) else p for p in page) if t not in held]
        if len(page) < PAGE:
            return found, dead
        start += PAGE


# Forget a dead holder only if it is still silent: one that beat meanwhile keeps its entry and its set.
_FORGET_IF_SILENT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3], KEYS[4])
return 1
"""


# Release the sweep lock only if it is still this sweep's (one that outlived its expiry leaves the next alone).
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def restore_orphans(
    redis: Any, restore: Callable[[list[str]], None], dead_after_s: float, lock_ttl_s: int = 120
) -> int:
    """Move back to their queues the messages no live worker holds; forget dead workers. Returns how many.
    One sweep at a time (a Redis lock; another finds it taken and does nothing): two at once would both
    restore a message, the second after a new worker received it, taking it from that worker and pushing
    it again, so that it ran twice."""
    token = uuid.uuid4().hex
    if not redis.set(keys.LIVENESS_SWEEP_LOCK, token, nx=True, ex=lock_ttl_s):
        return 0
    try:
        tags, dead = orphans(redis, dead_after_s)
        if tags:
            restore(tags)
            log.warning("restored messages of lost workers", extra={"count": len(tags), "dead_workers": len(dead)})
        for holder in dead:
            held, alive, suspect = keys.worker_held(holder), keys.worker_alive(holder), keys.worker_suspect(holder)
            redis.eval(_FORGET_IF_SILENT, 4, alive, keys.WORKERS, held, suspect, holder)
        return len(tags)
    finally:
        redis.eval(_UNLOCK, 1, keys.LIVENESS_SWEEP_LOCK, token)


def kombu_restore(app: Any) -> Callable[[list[str]], None]:
    """Restore with kombu's own code (the same as at the visibility timeout): one transaction per tag takes
    the message out of `unacked` and pushes it back to its queue, at the end served first."""

    def restore(tags: list[str]) -> None:
        with app.connection_for_write() as connection:
            qos = connection.default_channel.qos
            for tag in tags:
                qos.restore_by_tag(tag)

    return restore


_lock = threading.Lock()
_current: Holder | None = None
_pid: int | None = None


def current(redis_url: str, dead_after_s: int) -> Holder:
    """This worker process's holder, created (and its heartbeat started) on first use; a forked child makes
    its own."""
    global _current, _pid
    with _lock:
        if _current is None or _pid != os.getpid():
            _pid = os.getpid()
            from redis import Redis

            holder = Holder(Redis.from_url(redis_url, socket_timeout=5), dead_after_s)
            holder.start()
            _current = holder
        return _current


def stop_current() -> None:
    global _current
    with _lock:
        if _current is not None and _pid == os.getpid():
            _current.stop()
        _current = None
