"""Recall's first read: the search terms of a query and the parameters and statement of the candidate read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.graph import cypher
from worker.terms import terms
from worker.timeframe import Period

CANDIDATES = 100  # per candidate list, whatever the limit: a ranking must not depend on how many are asked


def search_terms(keywords: Sequence[str], text: str) -> list[str]:
    """What recall searches for: the terms of the query text, then those of the keywords."""
    return terms(text) + [t for k in keywords for t in terms(k)]


def candidate_params(
    *,
    terms_lucene: str | None,
    entity_lucene: str | None,
    period: Period | None,
    vector: Sequence[float] | None,
    user_id: str,
) -> dict[str, Any]:
    """The candidate read's parameters: a None list is one the read leaves out."""
    return {
        "terms": terms_lucene,
        "entity_query": entity_lucene,
        "period_from": period.start if period else None,
        "period_to": period.end if period else None,
        "vector": list(vector) if vector is not None else None,
        "k": CANDIDATES,
        "k_entities": CANDIDATES,
        "k_mentions": CANDIDATES * 4,
        "user_id": user_id,
    }


def candidates_statement(params: dict[str, Any]) -> str:
    return cypher.candidates_query(
        text=params["terms"] is not None,
        period=params["period_from"] is not None,
        entities=params["entity_query"] is not None,
        dense=params["vector"] is not None,
    )
