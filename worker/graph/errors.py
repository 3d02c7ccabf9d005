"""Translate Neo4j driver errors into the project's StoreUnavailable / StoreRequestError."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from neo4j.exceptions import (
    AuthError,
    DriverError,
    Neo4jError,
    ServiceUnavailable,
    SessionExpired,
    TransientError,
)

from worker.errors import StoreRequestError, StoreUnavailable

# A transaction that ran out of time (its own timeout; stopped while waiting on a lock) may pass later: transient.
_TIMEOUT_CODES = ("TransactionTimedOut", "LockAcquisitionTimeout", "LockClientStopped", "Transaction.Terminated")


@contextmanager
def translated(operation: str) -> Iterator[None]:
    """Re-raise driver errors as project errors. Messages carry the Neo4j status code, never the server's
    text, which can quote parameter values (conversation text)."""
    try:
        yield
    except (ServiceUnavailable, SessionExpired, TransientError, OSError) as exc:
        raise StoreUnavailable(f"neo4j unavailable during {operation}", cause=type(exc).__name__) from exc
    except AuthError as exc:
        raise StoreRequestError(f"neo4j refused the credentials during {operation}", cause="AuthError") from exc
    except Neo4jError as exc:
        code = exc.code or type(exc).__name__
        if exc.is_retryable() or any(part in code for part in _TIMEOUT_CODES):
            raise StoreUnavailable(f"neo4j asked to retry {operation}: {code}", cause=code) from exc
        raise StoreRequestError(f"neo4j refused {operation}: {code}", cause=code) from exc
    except DriverError as exc:
        raise StoreUnavailable(f"neo4j driver failed during {operation}", cause=type(exc).__name__) from exc
