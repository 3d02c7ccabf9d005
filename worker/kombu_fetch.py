"""kombu's Redis consumer, taking many messages in one round trip when many wait.

kombu takes one message per BRPOP, then records it in the `unacked` hash and its index in a second round trip
(MULTI, ZADD, HSET, EXEC): two round trips per message, and a message lost if the worker dies between them.
Here, after a BRPOP has delivered a message, one Lua script takes up to `MEMORY_FETCH_BATCH` - 1 more of the
same queues (no more than the channel's prefetch leaves room for) and records each in `unacked` in the same
atomic step, as kombu records it ([message, exchange, routing key], and its index); the channel's own
bookkeeping then skips its round trip for them.

A channel never holds more than its prefetch (Celery's: one message per thread) and asks for more as kombu
does, as soon as it has room: a message taken never waits for a thread, and its age in `unacked` means what
it meant. (Waiting for several free threads before asking, to take bigger batches, was measured and dropped:
no faster offline, and fewer LLM calls in flight.) At 1, kombu's own.

Nothing changes for a message once it is delivered: acknowledged, rejected, restored when the channel closes,
or brought back by the liveness sweep or the visibility timeout, as any other. A message the script cannot
read, or kombu cannot decode, goes back to the head of its queue as it was, and what was taken after it too,
in order: kombu's own BRPOP then meets it as before. A consumer refusing a message (its callback raising) gives
the rest of the batch back the same way, and the error goes on as on kombu's own path. Only messages for the
channel's own acknowledging consumer are taken so: a consumer without acknowledgements, or another channel's,
keeps kombu's path, and so does every channel of the process for ten minutes after Redis refused the script
(Redis before 7, scripting not allowed, out of memory).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

from kombu.utils import json as kombu_json
from redis.exceptions import ResponseError

log = logging.getLogger("memory.fetch")
loads = cast(Callable[[str], Any], kombu_json.loads)  # kombu's own decoding, as its BRPOP path reads a message

_SCRIPT = "_memory_take"  # on a channel: the registered script
_OWN = "_memory_own"  # on a channel: queue → the callback its acknowledging consumer registered for it
_RECORDED = "_memory_recorded"  # on a QoS: the tag being delivered that the script recorded in unacked
WARN_EVERY_S = 60.0  # a round trip that keeps failing (Redis away) is said once a minute
REFUSED_PAUSE_S = 600.0  # a script Redis refuses (Redis < 7, scripting not allowed, out of memory): kombu's path

# KEYS: unacked index, unacked hash, then the queues' keys in kombu's order; ARGV: most to take, now.
# Returns queue key, delivery tag, message, ... Every command below succeeds once the types are checked, and
# the shebang makes Redis (7+) refuse the whole script when it is out of memory: a message is never popped
# without being recorded.
TAKE = """#!lua
local function of_type(key, wanted)
  local t = redis.call('TYPE', key)['ok']
  return t == wanted or t == 'none'
end
if not of_type(KEYS[1], 'zset') or not of_type(KEYS[2], 'hash') then
  return redis.error_reply('WRONGTYPE unacked keys')
end
local most = tonumber(ARGV[1])
local out = {}
for i = 3, #KEYS do
  if redis.call('TYPE', KEYS[i])['ok'] == 'list' then
    while #out < 3 * most do
      local item = redis.call('RPOP', KEYS[i])
      if not item then break end
      local ok, m = pcall(cjson.decode, item)
      local props = ok and type(m) == 'table' and m['properties'] or nil
      local info = type(props) == 'table' and props['delivery_info'] or nil
      local tag = type(props) == 'table' and props['delivery_tag'] or nil
      if type(tag) ~= 'string' or type(info) ~= 'table' or type(info['exchange']) ~= 'string'
          or type(info['routing_key']) ~= 'string' then
        redis.call('RPUSH', KEYS[i], item)  -- back where it was, for kombu's own path
        return out
      end
      redis.call('ZADD', KEYS[1], ARGV[2], tag)
      redis.call('HSET', KEYS[2], tag,
        '[' .. item .. ',' .. cjson.encode(info['exchange']) .. ',' .. cjson.encode(info['routing_key']) .. ']')
      out[#out + 1] = KEYS[i]
      out[#out + 1] = tag
      out[#out + 1] = item
    end
  end
end
return out
"""


class _State:
    warned = float("-inf")
    paused_until = float("-inf")


def take_more(channel: Any, most: int) -> int:
    """After a BRPOP delivered one message: take up to most - 1 more in one round trip (as many as the prefetch
    leaves room for) and deliver them. Returns how many were delivered."""
    # kombu's own path for: a channel closing (its consumers are going), key prefixes, no acknowledgement
    # emulation, and a while after Redis refused the script
    if (
        channel._closing
        or channel.closed
        or channel.global_keyprefix
        or not channel.ack_emulation
        or time.monotonic() < _State.paused_until
    ):
        return 0
    qos = channel.qos
    want = min(most - 1, qos.can_consume_max_estimate() if qos.prefetch_count else most)
    # Only queues whose messages reach this channel's own acknowledging consumer: a consumer without
    # acknowledgements (nothing would remove what the script records) or another channel's keep kombu's path.
    own = channel.__dict__.get(_OWN, {})
    callbacks = channel.connection._callbacks
    queues = [
        queue
        for queue in channel._queue_cycle.consume(len(channel.active_queues))
        if queue in own and callbacks.get(queue) is own[queue]
    ]
    if want <= 0 or not queues:
        return 0
    keys = [channel._q_for_pri(queue, pri) for pri in channel.priority_steps for queue in queues]
    try:
        taken = _run(channel, [qos.unacked_index_key, qos.unacked_key, *keys], want)
    except ResponseError as exc:  # refused whole (see TAKE): nothing taken
        _State.paused_until = time.monotonic() + REFUSED_PAUSE_S
        log.error(
            "Redis refused the batch script; one message per round trip for a while",
            extra={"error_class": type(exc).__name__, "pause_s": REFUSED_PAUSE_S},
        )
        return 0
    except Exception as exc:
        # Nothing taken, or (the reply lost after the script ran) what it took waits in unacked for the
        # liveness sweep, as the messages of a lost worker do; kombu's next round trip meets the lost connection.
        if time.monotonic() - _State.warned >= WARN_EVERY_S:
            _State.warned = time.monotonic()
            log.warning("no messages taken in a batch", extra={"error_class": type(exc).__name__})
        return 0
    return _deliver(channel, [(_text(k), _text(t), i) for k, t, i in zip(*[iter(taken)] * 3, strict=True)])


def _run(channel: Any, keys: list[str], want: int) -> list[bytes]:
    with channel.conn_or_acquire() as client:
        script = channel.__dict__.get(_SCRIPT)
        if script is None:  # one per channel (kombu closes its clients with it)
            script = channel.__dict__.setdefault(_SCRIPT, client.register_script(TAKE))
        return cast(list[bytes], script(keys=keys, args=[want, time.time()], client=client))


def _deliver(channel: Any, taken: list[tuple[str, str, bytes]]) -> int:
    """Each message to the channel's consumer, in order; what cannot be decoded or delivered goes back."""
    qos = channel.qos
    for n, (key, tag, item) in enumerate(taken):
        try:
            payload = loads(_text(item))
        except Exception as exc:
            _give_back(channel, taken[n:])
            log.error("a message taken in a batch is unreadable; given back", extra={"error_class": type(exc).__name__})
            return n
        qos.__dict__[_RECORDED] = tag
        try:
            channel.connection._deliver(payload, key.rsplit(channel.sep, 1)[0])
        except BaseException:
            held = qos.__dict__.get(_RECORDED) is None  # appended (then the channel's, as on kombu's path)
            _give_back(channel, taken[n + 1 :] if held else taken[n:])
            raise
        finally:
            qos.__dict__[_RECORDED] = None
    return len(taken)


def _give_back(channel: Any, taken: list[tuple[str, str, bytes]]) -> None:
    """Messages taken but never held by the channel: out of unacked and back at the head of their queues as
    they were, in their order, in one transaction. If that fails (Redis away), they wait in unacked for the
    liveness sweep, as the messages of a lost worker do."""
    if not taken:
        return
    qos = channel.qos
    tags = [tag for _, tag, _ in taken]
    try:
        with qos.pipe_or_acquire() as pipe:  # kombu's own MULTI, as its QoS and worker/kombu_acks.py use
            pipe.zrem(qos.unacked_index_key, *tags).hdel(qos.unacked_key, *tags)
            for key, _, item in reversed(taken):
                pipe.rpush(key, item)
            pipe.execute()
    except Exception as exc:
        log.error(
            "messages taken in a batch not given back; the liveness sweep returns them",
            extra={"error_class": type(exc).__name__, "count": len(taken)},
        )


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value  # as kombu's bytes_to_str


def batch_fetch(most: int) -> None:
    """Idempotent; called when the Celery app is configured, before its first connection. 1: kombu's own."""
    from kombu.transport import redis as transport
    from kombu.transport import virtual

    if most <= 1 or getattr(transport.Channel._brpop_read, "_memory_fetch", False):
        return
    own_read: Any = transport.Channel._brpop_read
    own_consume: Any = transport.Channel.basic_consume
    own_append: Any = transport.QoS.append
    local_append: Any = virtual.QoS.append  # the channel's own bookkeeping, without Redis

    def _brpop_read(self: Any, **options: Any) -> Any:
        delivered = own_read(self, **options)  # True, or kombu raises Empty
        take_more(self, most)
        return delivered

    def basic_consume(self: Any, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any) -> Any:
        """Remembers the callback an acknowledging consumer registers for its queue (kombu keeps one per queue
        for the whole connection, replaced by a later consumer, removed by a cancel)."""
        tag = own_consume(self, queue, no_ack, callback, consumer_tag, **kwargs)
        own = self.__dict__.setdefault(_OWN, {})
        if no_ack:
            own.pop(queue, None)
        else:
            own[queue] = self.connection._callbacks.get(queue)
        return tag

    def append(self: Any, message: Any, delivery_tag: str) -> None:
        if delivery_tag == self.__dict__.get(_RECORDED):
            self.__dict__[_RECORDED] = None
            local_append(self, message, delivery_tag)  # the script recorded it in unacked
            return
        own_append(self, message, delivery_tag)

    _brpop_read._memory_fetch = True  # type: ignore[attr-defined]
    transport.Channel._brpop_read = _brpop_read  # type: ignore[method-assign]
    transport.Channel.basic_consume = basic_consume  # type: ignore[method-assign]
    transport.QoS.append = append  # type: ignore[method-assign]
