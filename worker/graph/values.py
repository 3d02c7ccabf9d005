"""Values read from Neo4j as plain Python values."""

from __future__ import annotations

from typing import Any


def native(value: Any) -> Any:
    """neo4j.time values → datetime, inside maps and lists too; everything else unchanged."""
    if isinstance(value, dict):
        return {k: native(v) for k, v in value.items()}
    if isinstance(value, list):
        return [native(v) for v in value]
    to_native = getattr(value, "to_native", None)
    return to_native() if callable(to_native) else value
