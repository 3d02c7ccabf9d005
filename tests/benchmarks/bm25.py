"""Plain BM25 (k1 1.2, b 0.75) for the references of bench_recall_quality, outside the service."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Hashable, Sequence

from worker.stopwords import ENGLISH_STOP

K1, B = 1.2, 0.75
_WORD = re.compile(r"\w+")


def plain_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in ENGLISH_STOP]


class BM25:
    def __init__(self, docs: dict[Hashable, list[str]]) -> None:
        self.tf = {k: Counter(v) for k, v in docs.items()}
        self.length = {k: len(v) for k, v in docs.items()}
        self.average = sum(self.length.values()) / max(len(docs), 1)
        self.df: Counter[str] = Counter()
        for counts in self.tf.values():
            self.df.update(counts.keys())

    def scores(self, query: Sequence[str]) -> dict[Hashable, float]:
        n, out = len(self.tf), {}
        for key, counts in self.tf.items():
            s = 0.0
            for word in set(query):
                f = counts.get(word, 0)
                if f:
                    idf = math.log(1 + (n - self.df[word] + 0.5) / (self.df[word] + 0.5))
                    s += idf * f * (K1 + 1) / (f + K1 * (1 - B + B * self.length[key] / self.average))
            if s > 0:
                out[key] = s
        return out
