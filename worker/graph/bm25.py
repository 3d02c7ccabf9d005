"""BM25 of recall's candidate windows with the statistics of the asking user's own memory.

Lucene scores with statistics of the whole index, every user's text together: a word in every one of this
user's episodes ("my boss …") still weighs as rare, and one user's ranking moves when others write. Lucene
only chooses the candidates here; they are scored again from their stored terms, with document frequencies
counted among the user's candidate windows, the user's window count as N, and the candidates' mean length.
The frequencies are exact while fewer of the user's windows share a term with the query than the read takes
(100); past that they are counted among those 100 (Lucene's best), so a word in thousands of a large user's
windows weighs less than a rare one, but not as little as exact counts would make it.
Each query term weighs by how often the query says it. k1 and b are Lucene's defaults (not fitted).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

K1 = 1.2
B = 0.75


def best_windows(
    query: Mapping[str, int], windows: Sequence[tuple[str, int, Sequence[str], int]], windows_total: int
) -> dict[str, tuple[float, int]]:
    """Per episode, the BM25 score of its best candidate window and that window's seq. A window is given as
    its occurrences of the query's terms and its length in terms (what the candidate read returns)."""
    counted: list[tuple[str, int, Counter[str], int]] = []
    df: Counter[str] = Counter()
    for episode_id, seq, found, length in windows:
        tf = Counter(t for t in found if t in query)
        counted.append((episode_id, seq, tf, length))
        df.update(tf.keys())
    if not counted:
        return {}
    n = max(windows_total, len(counted))
    average = sum(length for *_, length in counted) / len(counted) or 1.0
    idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
    best: dict[str, tuple[float, int]] = {}
    for episode_id, seq, tf, length in counted:
        norm = K1 * (1 - B + B * length / average)
        score = sum(query[t] * idf[t] * f * (K1 + 1) / (f + norm) for t, f in tf.items())
        if score > 0 and (episode_id not in best or (score, -seq) > (best[episode_id][0], -best[episode_id][1])):
            best[episode_id] = (score, seq)
    return best
