"""Fuse recall's candidate lists into one ranking: a pure function, so it can be read, tested and tuned alone.

Each list's scores are divided by that list's best score (BM25 values are not comparable across queries
or indexes), then weighted and added. The weights were measured on LoCoMo's dev split (see README, "Recall
quality"): the best search window of an episode leads; the whole episode's BM25 adds to it; an episode
that happened in the period the query names gets a fixed bonus. Entities the query names can add by how
informative they are for this user (inverse episode frequency): alone it lowered recall on LoCoMo at every
weight tried (offline extractor), together with embeddings 0.05 raised it, so its default is 0.05 with an
embedding model and 0 without (MEMORY_RECALL_ENTITY_WEIGHT overrides). Embedding similarities of the best
windows are spread to 0..1 over the candidates and added with MEMORY_RECALL_DENSE_WEIGHT. Ties go to the
episode id, so a ranking never depends on the limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FusionWeights:
    windows: float = 1.0
    episodes: float = 0.5
    period: float = 0.3
    # embedding similarity of the best window (only with MEMORY_EMBEDDING_MODEL; measured: 0.25 keeps
    # recall_any@5 and lifts @10 on LoCoMo, 0.5 and more lower @5)
    dense: float = 0.0
    entities: float = 0.0  # without embeddings 0.02–0.1 cost 0.3–0.4 points of recall_any@5 on LoCoMo

    @property
    def text(self) -> bool:
        return self.windows > 0 or self.episodes > 0


@dataclass(frozen=True)
class Ranked:
    id: str
    score: float
    seq: int | None  # the best search window, when one matched
    matched_by: list[str] = field(default_factory=list)


def _normalised(scores: dict[str, float]) -> dict[str, float]:
    top = max(scores.values(), default=0.0)
    return {k: v / top for k, v in scores.items()} if top > 0 else {}


def _spread(scores: dict[str, float]) -> dict[str, float]:
    """Similarities → 0..1 over the candidates (cosine values of one model sit in a narrow band, so dividing
    by the best would flatten them)."""
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high <= low:
        return dict.fromkeys(scores, 1.0)
    return {k: (v - low) / (high - low) for k, v in scores.items()}


def entity_scores(
    mentions: Sequence[dict[str, Any]], episodes_total: int
) -> tuple[dict[str, float], dict[str, list[str]]]:
    """Per episode: the sum of log(N / df) over the matched entities it mentions, and their names."""
    scores: dict[str, float] = {}
    names: dict[str, list[str]] = {}
    total = max(episodes_total, 1)
    for row in mentions:
        idf = math.log(total / max(int(row["df"]), 1))
        if idf <= 0:
            continue
        scores[row["id"]] = scores.get(row["id"], 0.0) + idf
        names.setdefault(row["id"], []).append(str(row["name"]))
    return scores, names


def fuse(
    *,
    windows: Sequence[dict[str, Any]],
    episodes: Sequence[dict[str, Any]],
    in_period: Sequence[str],
    mentions: Sequence[dict[str, Any]],
    episodes_total: int,
    weights: FusionWeights,
    limit: int,
    dense: Sequence[dict[str, Any]] = (),
) -> list[Ranked]:
    """The best `limit` episodes, best first."""
    by_window = _normalised({w["id"]: float(w["score"]) for w in windows})
    seqs = {d["id"]: int(d["seq"]) for d in dense}
    seqs.update({w["id"]: int(w["seq"]) for w in windows})  # the lexical best window is the passage shown
    by_dense = _spread({d["id"]: float(d["score"]) for d in dense})
    by_episode = _normalised({e["id"]: float(e["score"]) for e in episodes})
    by_entity_raw, names = entity_scores(mentions, episodes_total)
    by_entity = _normalised(by_entity_raw)
    period = set(in_period)

    total: dict[str, float] = {}
    lists = (
        (by_window, weights.windows),
        (by_episode, weights.episodes),
        (by_entity, weights.entities),
        (by_dense, weights.dense),
    )
    for scores, weight in lists:
        if weight > 0:
            for key, value in scores.items():
                total[key] = total.get(key, 0.0) + weight * value
    if weights.period > 0:
        for key in period:
            total[key] = total.get(key, 0.0) + weights.period

    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    out = []
    for key, score in ranked:
        matched = ["text"] if key in by_window or key in by_episode else []
        if key in by_dense and weights.dense > 0:
            matched.append("meaning")
        if key in period:
            matched.append("time")
        matched.extend(f"entity:{n}" for n in dict.fromkeys(names.get(key, ())))
        out.append(Ranked(key, round(score, 6), seqs.get(key), matched))
    return out
