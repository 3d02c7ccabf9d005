"""Fuse recall's candidate lists into one ranking: a pure function, so it can be read, tested and tuned alone.

Reciprocal rank fusion (Cormack et al., SIGIR 2009): a list adds weight / (k + rank) to each episode it ranks,
so lists whose scores are not comparable (BM25 of windows and of whole episodes, cosine similarities) are fused
by rank alone, with no scale to normalise and no weight fitted to one dataset: k = 60 as in the paper, weights
1 but for the whole-episode list's half (it is Lucene's, with the whole store's statistics, over the same words
as the windows; 0.5 measured at or above 1 on every dev set, 2 below). The lists: episodes by their best search
window (BM25 with the user's own statistics, worker/graph/bm25.py); by whole-episode BM25 (Lucene's); the
episodes that happened in the period the query names, in the order the two text lists rank them (those they
do not rank, after, latest first); and the nearest windows by embedding (with MEMORY_EMBEDDING_MODEL). Fusing
the two text lists first, then with time and meaning, measured lower on LoCoMo (tests/benchmarks/README.md).

Entities the query names were a list too; measured on every dev set they lowered recall and were removed.
Ties go to the episode id, so a ranking never depends on the limit. Figures: tests/benchmarks/README.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from worker.graph.bm25 import best_windows
from worker.graph.candidates import Candidates

RRF_K = 60


@dataclass(frozen=True)
class FusionWeights:
    windows: float = 1.0
    episodes: float = 0.5
    period: float = 1.0
    dense: float = 0.0  # MEMORY_RECALL_DENSE_WEIGHT (1) when an embedding model is configured
    k: int = RRF_K

    @property
    def text(self) -> bool:
        return self.windows > 0 or self.episodes > 0


@dataclass(frozen=True)
class Ranked:
    id: str
    score: float
    seq: int | None  # the best search window, when one matched
    matched_by: list[str] = field(default_factory=list)


def _by_score(scores: dict[str, float]) -> list[str]:
    return [k for k, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))]


def _add(total: dict[str, float], ranking: Iterable[str], weight: float, k: int) -> None:
    if weight > 0:
        for rank, key in enumerate(ranking, 1):
            total[key] = total.get(key, 0.0) + weight / (k + rank)


def fuse(candidates: Candidates, weights: FusionWeights, limit: int) -> list[Ranked]:
    """The best `limit` episodes, best first."""
    windows = best_windows(candidates.query, candidates.windows, candidates.windows_total)
    dense: dict[str, tuple[float, int]] = {}
    for key, similarity, nearest in candidates.dense:
        if key not in dense or similarity > dense[key][0]:
            dense[key] = (similarity, nearest)

    text_scores: dict[str, float] = {}
    _add(text_scores, _by_score({key: score for key, (score, _) in windows.items()}), weights.windows, weights.k)
    _add(text_scores, dict.fromkeys(candidates.episodes), weights.episodes, weights.k)
    text = _by_score(text_scores)
    total = dict(text_scores)
    period = set(candidates.in_period)
    found = set(text)
    then = [key for key in text if key in period] + [key for key in candidates.in_period if key not in found]
    _add(total, then, weights.period, weights.k)
    _add(total, _by_score({key: s for key, (s, _) in dense.items()}), weights.dense, weights.k)

    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    out = []
    for key, score in ranked:
        matched = ["text"] if key in found else []
        if key in dense and weights.dense > 0:
            matched.append("meaning")
        if key in period and weights.period > 0:
            matched.append("time")
        seq: int | None = windows[key][1] if key in windows else dense[key][1] if key in dense else None
        out.append(Ranked(key, round(score, 6), seq, matched))
    return out
