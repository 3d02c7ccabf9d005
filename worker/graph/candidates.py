"""Recall's first read: the search terms of a query and the parameters and statement of the candidate read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.graph import cypher
from worker.graph.lucene import MAX_QUERY_TERMS
from worker.terms import terms
from worker.timeframe import Period

CANDIDATES = 100  # per candidate list, whatever the limit: a ranking must not depend on how many are asked


def query_terms(text: str, expansion: Sequence[str] = ()) -> dict[str, int]:
    """What recall searches for: each term of the query with how often the query says it (a word said three
    times in a conversation weighs more), then the terms of `expansion` (keywords) the query lacks, once.
    Local keywords' terms are the query's own, so they count once, not twice (measured: no change).
    Every term counts, however long the query (the first 64 only, before: a question after a paragraph of
    small talk was not searched); past MAX_QUERY_TERMS the latest are kept, nearest to the question."""
    own = terms(text)
    counts = Counter(own)
    extra = [t for word in expansion for t in terms(word) if t not in counts]
    for term in extra:
        counts[term] = 1
    said = extra + own  # when the cap bites, the query's own latest terms are kept first
    if len(counts) > MAX_QUERY_TERMS:
        last = {t: i for i, t in enumerate(said)}
        kept = set(sorted(last, key=lambda t: -last[t])[:MAX_QUERY_TERMS])
        counts = Counter({t: n for t, n in counts.items() if t in kept})  # in the query's order still
    return dict(counts)


@dataclass(frozen=True)
class Candidates:
    """What the candidate read found for one recall, before fusion (worker/graph/fusion.py)."""

    # (episode id, window seq, the window's occurrences of the query's terms, its length in terms)
    windows: list[tuple[str, int, list[str], int]]
    windows_total: int  # the user's search windows: BM25 statistics are the user's own (worker/graph/bm25.py)
    episodes: list[str]  # episode ids by whole-episode BM25, best first
    in_period: list[str]  # episodes that happened in the period the query names, latest first
    dense: list[tuple[str, float, int]]  # (episode id, cosine, window seq) of the nearest windows, best first
    query: dict[str, int] = field(default_factory=dict)  # the query's terms and counts

    @classmethod
    def from_row(cls, row: Any, query: dict[str, int]) -> Candidates:
        return cls(
            windows=[(str(i), int(q), [str(t) for t in found], int(n)) for i, q, found, n in row["windows"]],
            windows_total=int(row["windows_total"]),
            episodes=[str(i) for i in row["episodes"]],
            in_period=[str(i) for i in row["in_period"]],
            dense=[(str(i), float(sc), int(q)) for i, sc, q in row["dense"]],
            query=query,
        )


def candidate_params(
    *,
    terms_lucene: str | None,
    period: Period | None,
    vector: Sequence[float] | None,
    user_id: str,
    query: Sequence[str] = (),
) -> dict[str, Any]:
    """The candidate read's parameters: a None list is one the read leaves out."""
    return {
        "terms": terms_lucene,
        "period_from": period.start if period else None,
        "period_to": period.end if period else None,
        "vector": list(vector) if vector is not None else None,
        "k": CANDIDATES,
        "query_terms": list(query),
        "user_id": user_id,
    }


def candidates_statement(params: dict[str, Any]) -> str:
    return cypher.candidates_query(
        text=params["terms"] is not None,
        period=params["period_from"] is not None,
        dense=params["vector"] is not None,
    )
