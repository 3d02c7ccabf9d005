"""Values read from Neo4j as plain Python values."""

from __future__ import annotations

from typing import Any


def native(value: Any) -> Any:
    """neo4j.time values → datetime, inside maps too (no list read here holds a time: embeddings are not
    walked float by float); everything else unchanged."""
    if isinstance(value, dict):
        return {k: native(v) for k, v in value.items()}
    to_native = getattr(value, "to_native", None)
    return to_native() if callable(to_native) else value
