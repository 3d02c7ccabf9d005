"""The project's error hierarchy: every error carries the data a caller needs to decide what to do."""

from __future__ import annotations


class MemoryServiceError(Exception):
    """Base class of every error this project raises on purpose."""


class SettingsError(MemoryServiceError):
    """Configuration is missing or invalid; the message names each offending MEMORY_ variable."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid settings: " + "; ".join(problems))


class EpisodeRejected(MemoryServiceError):
    """Input that can never be stored as given (validation failure); nothing was written or enqueued."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        super().__init__(f"{field}: {reason}" if field else reason)


class QueryRejected(MemoryServiceError):
    """A recall request that cannot be served as given (empty query, bad user id, limit out of range)."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        super().__init__(f"{field}: {reason}" if field else reason)


class StoreError(MemoryServiceError):
    """A graph-store failure. Subclasses say whether trying again can help."""

    transient = False

    def __init__(self, message: str, *, cause: str | None = None) -> None:
        self.cause = cause  # the underlying error class name, for logs and dead letters
        super().__init__(message)


class StoreUnavailable(StoreError):
    """The store cannot be reached or asked us to retry (outage, timeout, deadlock): transient."""

    transient = True


class StoreRequestError(StoreError):
    """The store refused the request itself (bad query, constraint, auth): retrying will not help."""


class LLMError(MemoryServiceError):
    """An LLM call failed. `transient` says whether a later retry can help; `retry_after_s` is the
    provider's own hint (Retry-After), when it sent one."""

    def __init__(self, message: str, *, transient: bool, cause: str, retry_after_s: float | None = None) -> None:
        self.transient = transient
        self.cause = cause
        self.retry_after_s = retry_after_s
        super().__init__(message)


class SessionMovedError(MemoryServiceError):
    """The session's extracted line kept moving under this episode's extraction (sends of one session
    persisting at the same moment, or the accepted episode no longer at hand to plan again): transient,
    the next attempt plans again."""


class QueueFull(MemoryServiceError):
    """Backpressure: more episodes are in flight than MEMORY_MAX_IN_FLIGHT. Nothing was enqueued; send again
    later (HTTP: 503 with Retry-After)."""

    def __init__(self, in_flight: int, limit: int) -> None:
        self.in_flight = in_flight
        self.limit = limit
        super().__init__(f"{in_flight} episodes in flight, the limit is {limit}: send again later")


def broker_errors() -> tuple[type[Exception], ...]:
    """What Redis (as the broker, or directly) raises when it cannot take a command: unreachable, timed out,
    or at its maxmemory."""
    from kombu.exceptions import OperationalError
    from redis.exceptions import ConnectionError, OutOfMemoryError, TimeoutError  # type: ignore[attr-defined]

    return (OperationalError, ConnectionError, TimeoutError, OutOfMemoryError)
