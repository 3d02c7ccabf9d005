"""kombu's Redis acknowledgements, sent to Redis in batches.

kombu's Redis transport emulates acknowledgements: a message taken from its queue is kept in the `unacked`
hash (and its index) until acknowledged, and each acknowledgement is a round trip of its own (MULTI, ZREM,
HDEL, EXEC). Here an acknowledgement is made at once in the channel's own bookkeeping (its prefetch slot is
free again, as before) and its removal from Redis waits up to `MEMORY_ACK_BATCH_MS` for the others of that
interval: one round trip for all of them.

Nothing can be lost by the wait, and nothing done twice: a message is acknowledged after its work committed;
one whose removal had not reached Redis when its worker died stays in `unacked`, comes back (the liveness
sweep, or the visibility timeout) and finds its episode stored, a no-op. (The same holds for a removal that
lands after such a message was handed out again: a delivery tag stays with its message, so the late removal
takes the second delivery's entry, whose work the first one committed.) What waits is sent before the
channel closes (a warm shutdown, a lost connection), after any round trip under way; a round trip that fails
is tried again. At 0, kombu's own acknowledgement.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("memory.acks")

_ATTR = "_memory_acks"
RETRY_S = 1.0  # after a failed round trip (Redis away), the next try
CLOSE_WAIT_S = 10.0  # a closing channel waits this long for a round trip under way (a connect can hang)


class AckBatch:
    """The acknowledgements of one channel (its QoS) waiting to be removed from Redis."""

    def __init__(self, qos: Any, wait_s: float) -> None:
        self._qos = qos
        self._wait_s = wait_s
        self._lock = threading.Lock()  # the waiting tags
        self._sending = threading.Lock()  # one round trip at a time: close() waits for the one under way
        self._tags: list[str] = []
        self._due = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, tag: str) -> bool:
        """Queue one tag; False once closed (the caller removes it itself)."""
        with self._lock:
            if self._closing.is_set():
                return False
            self._tags.append(tag)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="memory-acks", daemon=True)
                self._thread.start()
        self._due.set()
        return True

    def flush(self, wait_s: float | None = None) -> bool:
        """Remove what waits in one round trip; on failure it waits for the next. wait_s: how long to wait for
        a round trip under way (None: as long as it takes)."""
        if not self._sending.acquire(timeout=-1 if wait_s is None else wait_s):
            with self._lock:
                count = len(self._tags)
            log.warning("acknowledgements not sent: a round trip still under way", extra={"count": count})
            return False
        try:
            return self._send()
        finally:
            self._sending.release()

    def _send(self) -> bool:
        with self._lock:
            tags, self._tags = self._tags, []
        if not tags:
            return True
        qos = self._qos
        try:
            with qos.pipe_or_acquire() as pipe:  # kombu's own MULTI, as its QoS.append and ack use
                pipe.zrem(qos.unacked_index_key, *tags).hdel(qos.unacked_key, *tags).execute()
        except Exception as exc:
            with self._lock:
                self._tags[:0] = tags
            log.warning("acknowledgements not sent", extra={"error_class": type(exc).__name__, "count": len(tags)})
            return False
        return True

    def close(self) -> None:
        """Send what waits, once the round trip under way (if any) is over (at most CLOSE_WAIT_S); what a
        failure leaves comes back later as a delivery of work already done."""
        with self._lock:
            self._closing.set()
        self._due.set()
        self.flush(CLOSE_WAIT_S)

    def _run(self) -> None:
        while not self._closing.is_set():
            self._due.wait()
            if self._closing.wait(self._wait_s):  # the acknowledgements of this interval go together
                return  # close() sends what waits
            self._due.clear()
            if not self.flush():
                self._closing.wait(RETRY_S)
                self._due.set()


def batch_of(qos: Any, wait_s: float) -> AckBatch:
    """The channel's batch, made on its first acknowledgement (wait_s applies to a new one only). setdefault
    is atomic: of two threads racing, one batch wins (a batch starts its thread only on its first tag)."""
    batch: AckBatch = qos.__dict__.get(_ATTR) or qos.__dict__.setdefault(_ATTR, AckBatch(qos, wait_s))
    return batch


def batch_acks(wait_ms: int) -> None:
    """Idempotent; called when the Celery app is configured, before its first connection. 0: kombu's own.
    The first call's wait holds for the process (a later call changes nothing; tests set a channel's own with
    batch_of)."""
    from kombu.transport import redis as transport
    from kombu.transport import virtual

    if wait_ms <= 0 or getattr(transport.QoS.ack, "_memory_batches", False):
        return
    own_ack: Any = transport.QoS.ack
    local_ack: Any = virtual.QoS.ack  # the channel's own bookkeeping, without Redis
    own_restore: Any = transport.QoS.restore_unacked_once
    wait_s = wait_ms / 1000

    def ack(self: Any, delivery_tag: str) -> None:
        if not batch_of(self, wait_s).add(delivery_tag):
            own_ack(self, delivery_tag)
            return
        local_ack(self, delivery_tag)

    def restore_unacked_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        """The channel closes: the acknowledgements that wait go first (kombu restores the rest)."""
        batch = self.__dict__.get(_ATTR)
        if batch is not None:
            batch.close()
        return own_restore(self, *args, **kwargs)

    ack._memory_batches = True  # type: ignore[attr-defined]
    transport.QoS.ack = ack  # type: ignore[method-assign]
    transport.QoS.restore_unacked_once = restore_unacked_once  # type: ignore[method-assign]
