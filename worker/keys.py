"""Every Redis key and queue name of the project, in one place."""

from __future__ import annotations

PREFIX = "memory"

LLM_RATE_LIMIT = f"{PREFIX}:ratelimit:llm"


def keywords_cache(user_tag: str, digest: str) -> str:
    """Cached LLM keywords; per user so that forgetting a user can find and delete them."""
    return f"{PREFIX}:kw:{user_tag}:{digest}"


def keywords_cache_pattern(user_tag: str) -> str:
    return f"{PREFIX}:kw:{user_tag}:*"
