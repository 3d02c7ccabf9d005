"""Reciprocal rank fusion of several ranked candidate lists (pure functions)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

RRF_K = 60  # the constant from Cormack et al.; damps the weight of the very first ranks


def reciprocal_rank_fusion(rankings: Sequence[Sequence[K]], k: int = RRF_K) -> dict[K, float]:
    """score(d) = Σ over lists of 1 / (k + rank of d in that list), ranks from 1."""
    scores: dict[K, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return scores
