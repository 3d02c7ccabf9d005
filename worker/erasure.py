"""The Redis side of an erasure mark: `forget_user` writes when it began (epoch seconds) under the user's tag.
Writers that could outlive an erasure check it before they keep anything of the user: the dead-letter path
(a stage failing for good after the erasure) and recall's late cache writes (a query embedding or LLM
keywords that finish after it)."""

from __future__ import annotations

import time
from typing import Any

from worker import keys

ERASURE_KEY_TTL_S = 7 * 86_400  # longer than any message lives (retries within the visibility timeout)


def mark(redis: Any, tag: str, erased_at: float) -> None:
    redis.set(keys.erasure_key(tag), repr(erased_at), ex=ERASURE_KEY_TTL_S)


def erased_at(redis: Any, tag: str) -> float | None:
    raw = redis.get(keys.erasure_key(tag))
    return None if raw is None else float(raw)


def erased_since(redis: Any, tag: str, started_at: float) -> bool:
    """Was the user erased after `started_at` (so what was computed for them since must not be kept)?"""
    at = erased_at(redis, tag)
    return at is not None and at >= started_at


def now() -> float:
    return time.time()
