"""Every Redis key and queue name of the project, in one place."""

from __future__ import annotations

PREFIX = "memory"

LLM_RATE_LIMIT = f"{PREFIX}:ratelimit:llm"

EXTRACT_QUEUE = "memory.extract"
PERSIST_QUEUE = "memory.persist"
QUEUES = (EXTRACT_QUEUE, PERSIST_QUEUE)

INFLIGHT_INDEX = f"{PREFIX}:inflight"  # sorted set: episode id → last sign of life
INFLIGHT_PAYLOADS = f"{PREFIX}:inflight:payloads"  # hash: episode id → {"user_id", "payload"}
INFLIGHT_SWEEP_LOCK = f"{PREFIX}:inflight:sweep-lock"
# hash: episode id → its last sign of life when a sweep with the broker busy found no message for it
INFLIGHT_SUSPECTS = f"{PREFIX}:inflight:suspects"
LIVENESS_SWEEP_LOCK = f"{PREFIX}:worker:sweep-lock"  # one liveness sweep at a time (worker/liveness.py)
KOMBU_UNACKED = "unacked"  # kombu's hash of messages delivered to a worker and not acknowledged yet
KOMBU_UNACKED_INDEX = "unacked_index"  # kombu's sorted set: delivery tag → when it was delivered
WORKERS = f"{PREFIX}:workers"  # set of worker process ids that announced themselves (worker/liveness.py)

DLQ_INDEX = f"{PREFIX}:dlq:index"  # sorted set: record id → first failure time


def queue_lists(queue: str) -> list[str]:
    """The Redis lists of one queue: kombu keeps priorities 3, 6 and 9 in lists of their own (separator
    "\x06\x16"), so a queue's depth is the sum of all four."""
    return [queue] + [f"{queue}\x06\x16{step}" for step in (3, 6, 9)]


def dlq_record(record_id: str) -> str:
    return f"{PREFIX}:dlq:record:{record_id}"


def dlq_user(user_tag: str) -> str:
    """Set of a user's dead-letter record ids (for erasure)."""
    return f"{PREFIX}:dlq:user:{user_tag}"


def deliveries(task_id: str, retries: int) -> str:
    """How many times this attempt of a task was delivered without finishing (poison detection)."""
    return f"{PREFIX}:deliveries:{task_id}:{retries}"


def keywords_cache(user_tag: str, digest: str) -> str:
    """Cached LLM keywords; per user so that forgetting a user can find and delete them."""
    return f"{PREFIX}:kw:{user_tag}:{digest}"


def query_vector_cache(user_tag: str, digest: str) -> str:
    """A recall query's cached embedding: under the user's query-cache prefix, so erasure finds it too."""
    return f"{PREFIX}:kw:{user_tag}:vec:{digest}"


def keywords_cache_pattern(user_tag: str) -> str:
    return f"{PREFIX}:kw:{user_tag}:*"


def forgotten_key(tombstone: str) -> str:
    """When an episode or session was last forgotten (worker/graph/forget.py's tombstone, mirrored here for
    the dead-letter path, which runs when Neo4j may be down)."""
    return f"{PREFIX}:forgotten:{tombstone}"


def cache_purged_key(user_tag: str) -> str:
    """When the user's recall caches were last purged (a forget of an episode or session): a recall that
    started before then writes no cache entry after it."""
    return f"{PREFIX}:cache-purged:{user_tag}"


def erasure_key(user_tag: str) -> str:
    """When the user was last erased (epoch seconds): the dead-letter path checks it, since a stage that
    fails for good after an erasure must not keep the user's text in a dead letter."""
    return f"{PREFIX}:erased:{user_tag}"


STATS = f"{PREFIX}:stats"  # hash of counters shared by every worker process (see worker/stats.py)


def worker_alive(holder: str) -> str:
    """A worker process's liveness key, renewed every few seconds, expiring when it stops renewing."""
    return f"{PREFIX}:worker:alive:{holder}"


def worker_held(holder: str) -> str:
    """Set of the delivery tags a worker process holds (received, not acknowledged)."""
    return f"{PREFIX}:worker:held:{holder}"


def worker_suspect(holder: str) -> str:
    """When a sweep first found a worker's liveness key gone (it is taken for dead a little later)."""
    return f"{PREFIX}:worker:suspect:{holder}"
