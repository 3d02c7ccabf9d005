"""kombu's Redis consumer, taking many messages in one round trip when many wait.

kombu takes one message per BRPOP, then records it in the `unacked` hash and its index in a second round trip
(MULTI, ZADD, HSET, EXEC): two round trips per message, and a message lost if the worker dies between them.
Here, after a BRPOP has delivered a message, one Lua script takes up to `MEMORY_FETCH_BATCH` - 1 more of the
same queues and records each in `unacked` in the same atomic step, exactly as kombu would (same hash value,
same index); the channel's own bookkeeping then skips its round trip for them.

So that a busy worker takes messages in bursts rather than one per finished task, a channel asks for more
once it holds no more than its prefetch (Celery's: one per thread), and then takes up to the batch: a busy
worker holds up to MEMORY_FETCH_BATCH - 1 messages beyond its prefetch, which wait for a thread (its threads
never wait for a round trip to Redis). At 1, kombu's own.

Nothing changes for a message once it is delivered: acknowledged, rejected, restored when the channel closes,
or brought back by the visibility timeout or the liveness sweep, as any other. A message the script cannot read
(no delivery tag) is pushed back where it was and left to kombu's own path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

from kombu.utils import json as kombu_json

log = logging.getLogger("memory.fetch")
loads = cast(Callable[[str], Any], kombu_json.loads)  # kombu's own decoding, as its BRPOP path reads a message

_RECORDED = "_memory_recorded"  # on a QoS: tags the script recorded in unacked, not yet appended locally
_SCRIPT = "_memory_take"  # on a channel: the registered script
_NO_ACK = "_memory_no_ack"  # on a channel: it has had a consumer without acknowledgements

# KEYS: unacked index, unacked hash, then the queues' keys in kombu's order; ARGV: most to take, now.
# Returns queue key, message, queue key, message... Every command below succeeds once the types are checked,
# and the shebang makes Redis (7+) refuse the whole script when it is out of memory: a message is never popped
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
    while #out < 2 * most do
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
      out[#out + 1] = item
    end
  end
end
return out
"""


def room(qos: Any, most: int) -> int:
    """How many more messages the channel may hold: up to its prefetch plus most - 1 (no prefetch: most)."""
    if not qos.prefetch_count:
        return most
    return int(qos.prefetch_count) + most - 1 - (len(qos._delivered) - len(qos._dirty))


def take_more(channel: Any, most: int) -> int:
    """After a BRPOP delivered one message: take and deliver up to most - 1 more in one round trip (as many as
    room() allows). Returns how many were delivered."""
    qos = channel.qos
    want = min(most - 1, room(qos, most))
    queues = channel._queue_cycle.consume(len(channel.active_queues))
    # A consumer without acknowledgements never removes what the script records: kombu's own path for it.
    if want <= 0 or not queues or channel.global_keyprefix or channel.__dict__.get(_NO_ACK):
        return 0
    keys = [channel._q_for_pri(queue, pri) for pri in channel.priority_steps for queue in queues]
    try:
        with channel.conn_or_acquire() as client:
            script = channel.__dict__.get(_SCRIPT)
            if script is None:  # one per channel (kombu closes its clients with it)
                script = channel.__dict__.setdefault(_SCRIPT, client.register_script(TAKE))
            index, unacked = qos.unacked_index_key, qos.unacked_key
            taken = script(keys=[index, unacked, *keys], args=[want, time.time()], client=client)
    except Exception as exc:  # nothing taken (see TAKE); the next BRPOP meets a lost connection as kombu does
        log.warning("no messages taken in a batch", extra={"error_class": type(exc).__name__})
        return 0
    pairs = list(zip(taken[::2], taken[1::2], strict=True))
    recorded: set[str] = qos.__dict__.setdefault(_RECORDED, set())
    payloads = [loads(_text(item)) for _, item in pairs]
    recorded.update(p["properties"]["delivery_tag"] for p in payloads)
    for n, ((key, _), payload) in enumerate(zip(pairs, payloads, strict=True)):
        try:
            channel.connection._deliver(payload, _text(key).rsplit(channel.sep, 1)[0])
        except Exception as exc:
            _give_back(qos, [p["properties"]["delivery_tag"] for p in payloads[n:]], recorded)
            log.error("taken messages not delivered; given back", extra={"error_class": type(exc).__name__})
            return n
    return len(pairs)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _give_back(qos: Any, tags: list[str], recorded: set[str]) -> None:
    """Messages the script recorded that never reached the channel's bookkeeping go back to the head of their
    queue, in their order."""
    for tag in reversed(tags):
        recorded.discard(tag)
        if tag not in qos._delivered:
            qos.restore_by_tag(tag)


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
        delivered = own_read(self, **options)
        if delivered:
            take_more(self, most)
        return delivered

    def basic_consume(self: Any, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self.__dict__[_NO_ACK] = True
        return own_consume(self, queue, no_ack, *args, **kwargs)

    def append(self: Any, message: Any, delivery_tag: str) -> None:
        recorded = self.__dict__.get(_RECORDED)
        if recorded and delivery_tag in recorded:
            recorded.discard(delivery_tag)
            local_append(self, message, delivery_tag)
            return
        own_append(self, message, delivery_tag)

    def can_consume(self: Any) -> bool:
        """Another BRPOP once the channel holds no more than its prefetch (kombu's: less than it)."""
        prefetch = self.prefetch_count
        return not prefetch or len(self._delivered) - len(self._dirty) <= prefetch

    _brpop_read._memory_fetch = True  # type: ignore[attr-defined]
    transport.Channel._brpop_read = _brpop_read  # type: ignore[method-assign]
    transport.Channel.basic_consume = basic_consume  # type: ignore[method-assign]
    transport.QoS.append = append  # type: ignore[method-assign]
    transport.QoS.can_consume = can_consume  # type: ignore[method-assign]
