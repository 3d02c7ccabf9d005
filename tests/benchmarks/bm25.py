"""Reference rankings for bench_locomo, outside the service: plain BM25 (k1 1.2, b 0.75) over each session's
raw text, without and with stemming, and over 3-message windows (best window per session)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

from tests.locomo import Conversation, Session
from worker.stopwords import ENGLISH_STOP
from worker.terms import terms

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


Ranker = Callable[[str], list[int]]


def _text(messages: Sequence[dict[str, str]]) -> str:
    return "\n".join(m["content"] for m in messages)


def sessions_ranker(conversation: Conversation, analyse: Callable[[str], list[str]]) -> Ranker:
    index = BM25({s.number: analyse(_text(s.messages)) for s in conversation.sessions})

    def rank(question: str) -> list[int]:
        scored = index.scores(analyse(question))
        return [int(str(k)) for k in sorted(scored, key=lambda k: -scored[k])]

    return rank


def windows_ranker(conversation: Conversation) -> Ranker:
    docs: dict[Hashable, list[str]] = {}
    for session in conversation.sessions:
        for i in range(len(session.messages)):
            docs[(session.number, i)] = terms(_text(_around(session, i)))
    index = BM25(docs)

    def rank(question: str) -> list[int]:
        best: dict[int, float] = {}
        for key, value in index.scores(terms(question)).items():
            number = key[0]  # type: ignore[index]
            best[number] = max(best.get(number, 0.0), value)
        return sorted(best, key=lambda k: -best[k])

    return rank


def _around(session: Session, i: int) -> list[dict[str, str]]:
    return session.messages[max(0, i - 1) : i + 2]


REFERENCES: dict[str, Callable[[Conversation], Ranker]] = {
    "bm25 sessions, stop words removed": lambda c: sessions_ranker(c, plain_words),
    "bm25 sessions, stemmed": lambda c: sessions_ranker(c, terms),
    "bm25 3-message windows, stemmed, best per session": windows_ranker,
}


def reference_scores(conversations: Sequence[Conversation], ks: Sequence[int] = (5, 10)) -> dict[str, dict[str, float]]:
    out = {}
    for name, build in REFERENCES.items():
        hits = dict.fromkeys(ks, 0)
        total = 0
        for conversation in conversations:
            rank = build(conversation)
            for question in conversation.questions:
                ranked = rank(question.text)
                total += 1
                for k in ks:
                    hits[k] += bool(set(ranked[:k]) & question.gold)
        out[name] = {f"recall_any@{k}": round(hits[k] / max(total, 1), 3) for k in ks}
    return out
