"""Values read from Neo4j as plain Python values."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # times read as epoch milliseconds count from here


def native(value: Any) -> Any:
    """neo4j.time values → datetime, inside maps too; lists are not walked (embeddings would be, float by
    float): a list that holds a time is converted by its reader (export_lines: an episode's ended facts)."""
    if isinstance(value, dict):
        return {k: native(v) for k, v in value.items()}
    to_native = getattr(value, "to_native", None)
    return to_native() if callable(to_native) else value
