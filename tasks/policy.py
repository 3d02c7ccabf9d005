"""Retry policy, in one place: which failures retry, after how long, and when to give up (dead letter)."""

from __future__ import annotations

import random
from collections.abc import Callable

from worker.errors import LLMError, SessionMovedError, StoreError
from worker.settings import Settings


def backoff_delay_s(attempt: int, base_s: float, cap_s: float, rand: Callable[[], float] = random.random) -> float:
    """Exponential backoff with "equal jitter": half of min(cap, base·2^attempt) fixed, half random."""
    ceiling = min(cap_s, base_s * 2 ** min(attempt, 32))
    return float(ceiling / 2 + rand() * ceiling / 2)


def is_transient(exc: BaseException) -> bool:
    """Outages, timeouts, rate limits: worth another try. Anything else is permanent."""
    if isinstance(exc, LLMError | StoreError):
        return exc.transient
    if isinstance(exc, SessionMovedError):
        return True
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:  # pragma: no cover - redis is a dependency
        return isinstance(exc, OSError)
    return isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError)


def retry_delay_s(exc: BaseException, attempt: int, settings: Settings) -> float | None:
    """Seconds to wait before the next attempt, or None to dead-letter now.

    A provider's Retry-After is honoured (up to the backoff cap, which the visibility timeout outlasts).
    """
    if not is_transient(exc) or attempt >= settings.retry_max_attempts:
        return None
    delay = backoff_delay_s(attempt, settings.retry_backoff_base_s, settings.retry_backoff_cap_s)
    hint = getattr(exc, "retry_after_s", None)
    if isinstance(hint, int | float) and hint > delay:
        delay = min(float(hint), settings.retry_backoff_cap_s)
    return delay
