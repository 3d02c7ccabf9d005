"""The one place that decides whether an LLM failure is worth retrying.

Works on exception class names and status codes, so it needs no litellm import (litellm's exceptions
subclass openai's, whose names are stable).
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from typing import Any

_TRANSIENT_NAMES = frozenset(
    {
        "RateLimitError",
        "Timeout",
        "APITimeoutError",
        "APIConnectionError",
        "InternalServerError",
        "ServiceUnavailableError",
        "BadGatewayError",
        "TimeoutError",
        "ConnectionError",
        "ConnectTimeout",
        "ReadTimeout",
        "ConnectError",
        "RemoteProtocolError",
    }
)
_PERMANENT_NAMES = frozenset(
    {
        "ContextWindowExceededError",
        "AuthenticationError",
        "PermissionDeniedError",
        "BadRequestError",
        "NotFoundError",
        "UnprocessableEntityError",
        "ContentPolicyViolationError",
        "UnsupportedParamsError",
        "BudgetExceededError",
    }
)


@dataclass(frozen=True)
class LLMFailure:
    transient: bool
    reason: str  # rate_limit, timeout, connection, server_error, context_too_long, auth, bad_request, unknown
    error_class: str
    retry_after_s: float | None = None


def _names(exc: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(exc).__mro__]


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def retry_after_seconds(headers: Any, now: float | None = None) -> float | None:
    """Retry-After (seconds or HTTP date) or retry-after-ms, from any mapping of headers."""
    if headers is None:
        return None
    get = getattr(headers, "get", None)
    if get is None:
        return None
    millis = get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        return max(0.0, parsed.timestamp() - (time.time() if now is None else now))


def classify_llm_error(exc: BaseException) -> LLMFailure:
    names = _names(exc)
    error_class = names[0]
    status = _status(exc)
    retry_after = retry_after_seconds(getattr(getattr(exc, "response", None), "headers", None))
    if "ContextWindowExceededError" in names:
        return LLMFailure(False, "context_too_long", error_class)
    if "RateLimitError" in names or status == 429:
        return LLMFailure(True, "rate_limit", error_class, retry_after)
    if any(n in ("Timeout", "APITimeoutError", "TimeoutError", "ReadTimeout", "ConnectTimeout") for n in names):
        return LLMFailure(True, "timeout", error_class, retry_after)
    if any(n in ("AuthenticationError", "PermissionDeniedError") for n in names) or status in (401, 403):
        return LLMFailure(False, "auth", error_class)
    if any(n in _PERMANENT_NAMES for n in names) or (status is not None and 400 <= status < 500):
        return LLMFailure(False, "bad_request", error_class)
    if (status is not None and status >= 500) or any(n in _TRANSIENT_NAMES for n in names):
        return LLMFailure(True, "server_error" if status else "connection", error_class, retry_after)
    if isinstance(exc, OSError):
        return LLMFailure(True, "connection", error_class)
    return LLMFailure(False, "unknown", error_class)
