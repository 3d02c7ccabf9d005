"""The recall dev sets in one shape, their BM25 references and their metrics.

Each set is episodes to store (one user per LoCoMo conversation or MADial user, a key per episode) and
questions with the keys that answer them, in categories. The data are read from ../shared/datasets (never
copied here): LoCoMo (Maharana et al., ACL 2024; CC BY-NC 4.0), MADial-Bench zh (He et al., NAACL 2025; MIT),
and this project's relevance set (tests/data/relevance.json). The references are plain BM25 (k1 1.2, b 0.75)
over each user's episodes, computed here on the same data, without any of recall's code.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tests import locomo, madial
from tests.benchmarks.bm25 import BM25, plain_words
from tests.relevance import load_dataset
from worker.stopwords import ENGLISH_STOP
from worker.terms import terms


@dataclass(frozen=True)
class Item:
    user: str
    session: str
    messages: list[dict[str, str]]
    occurred_at: datetime | None
    key: str


@dataclass(frozen=True)
class Ask:
    user: str
    text: str
    gold: frozenset[str]
    category: str


Ranking = Callable[[Ask], list[str]]


@dataclass
class RecallSet:
    name: str
    about: str
    items: list[Item]
    asks: list[Ask]
    references: dict[str, Callable[[RecallSet], Ranking]] = field(default_factory=dict)
    # categories reported but not counted in the set's overall figures (paraphrases: only meaning finds them)
    apart: frozenset[str] = frozenset()


_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_RUN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")


def char_bigrams(text: str) -> list[str]:
    """CJK runs as overlapping character bigrams, other words lower-cased."""
    out: list[str] = []
    for run in _RUN.findall(text.lower()):
        if re.match(rf"[{_CJK}]", run):
            out.extend([run[i : i + 2] for i in range(len(run) - 1)] if len(run) > 1 else [run])
        else:
            out.append(run)
    return out


def jieba_words(text: str) -> list[str]:
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    return [w for w in jieba.lcut(text.lower()) if _RUN.search(w)]


def _text(item: Item, messages: slice = slice(None)) -> str:
    return "\n".join(m["content"] for m in item.messages[messages])


def bm25_reference(analyse: Callable[[str], list[str]], windows: int = 0) -> Callable[[RecallSet], Ranking]:
    """BM25 over each user's episodes (windows=0), or over windows of 2·windows+1 messages, best per episode."""

    def build(data: RecallSet) -> Ranking:
        indexes: dict[str, BM25] = {}
        for user in {i.user for i in data.items}:
            docs: dict[Any, list[str]] = {}
            for item in (i for i in data.items if i.user == user):
                if windows:
                    for n in range(len(item.messages)):
                        docs[(item.key, n)] = analyse(_text(item, slice(max(0, n - windows), n + windows + 1)))
                else:
                    docs[item.key] = analyse(_text(item))
            indexes[user] = BM25(docs)

        def rank(ask: Ask) -> list[str]:
            best: dict[str, float] = {}
            for key, score in indexes[ask.user].scores(analyse(ask.text)).items():
                episode = str(key[0] if isinstance(key, tuple) else key)
                best[episode] = max(best.get(episode, 0.0), score)
            return sorted(best, key=lambda k: (-best[k], k))

        return rank

    return build


def locomo_set(only: int | None = None) -> RecallSet:
    conversations = locomo.load_conversations(locomo.dataset_dir(), only=only)
    items = [
        Item(c.name, locomo.session_id(s.number), s.messages, s.occurred_at, f"{c.name}/{s.number}")
        for c in conversations
        for s in c.sessions
    ]
    asks = [
        Ask(c.name, q.text, frozenset(f"{c.name}/{n}" for n in q.gold), locomo.CATEGORIES[q.category])
        for c in conversations
        for q in c.questions
    ]
    references = {
        "bm25 episodes, stop words removed": bm25_reference(plain_words),
        "bm25 episodes, stemmed": bm25_reference(terms),
        "bm25 3-message windows, stemmed, best per episode": bm25_reference(terms, windows=1),
    }
    about = f"LoCoMo ({locomo.dataset_dir()}; Maharana et al., ACL 2024; CC BY-NC 4.0)"
    return RecallSet("locomo", about, items, asks, references)


def madial_set() -> RecallSet:
    data = madial.load_madial(madial.dataset_dir())
    items = [
        Item(m.user, f"memory-{m.id}", [{"role": "user", "content": m.text}], m.occurred_at, m.id)
        for m in data.memories
    ]
    asks = [Ask(d.user, d.text, d.gold, "dialogue") for d in data.dialogues]
    references = {
        "bm25 character bigrams": bm25_reference(char_bigrams),
        "bm25 jieba words": bm25_reference(jieba_words),
    }
    about = f"MADial-Bench zh ({madial.dataset_dir()}; He et al., NAACL 2025; MIT)"
    return RecallSet("madial-zh", about, items, asks, references)


def _bigrams_no_stop(text: str) -> list[str]:
    return [t for t in char_bigrams(text) if t not in ENGLISH_STOP]


def _chinese(text: str) -> bool:
    return bool(re.search(rf"[{_CJK}]", text))


def relevance_set() -> RecallSet:
    data = load_dataset()
    items = [
        Item(e["user"], e["session"], [{"role": r, "content": t} for r, t in e["messages"]], None, e["key"])
        for e in data.episodes
    ]
    asks = [Ask(q.user, q.text, q.answers, "lexical " + ("zh" if _chinese(q.text) else "en")) for q in data.queries]
    asks += [Ask(q.user, q.text, q.answers, "paraphrase") for q in data.paraphrases]
    asks += [Ask(q.user, q.text, q.answers, "near-twins") for q in data.twins]
    asks += [Ask(q.user, q.text, q.answers, "chatty") for q in data.chatty]
    asks += [Ask(q.user, q.alone or q.text, q.answers, "chatty, alone") for q in data.chatty]
    references = {
        "bm25 character bigrams, English stop words removed": bm25_reference(_bigrams_no_stop),
        "bm25 stemmed": bm25_reference(terms),
    }
    about = "this project's relevance set (tests/data/relevance.json); overall figures without the paraphrases"
    return RecallSet("relevance", about, items, asks, references, apart=frozenset({"paraphrase"}))


def all_sets() -> list[RecallSet]:
    return [locomo_set(), madial_set(), relevance_set()]


METRICS = ("recall_any@5", "recall_any@10", "r_precision", "hit@1", "all_gold@5")


def metrics(ranked: Sequence[str], gold: frozenset[str]) -> dict[str, float]:
    return {
        "recall_any@5": float(bool(set(ranked[:5]) & gold)),
        "recall_any@10": float(bool(set(ranked[:10]) & gold)),
        "r_precision": len(set(ranked[: len(gold)]) & gold) / len(gold),
        "hit@1": float(bool(ranked[:1]) and ranked[0] in gold),
        "all_gold@5": float(gold <= set(ranked[:5])),
    }


def summary(
    asks: Sequence[Ask], rankings: Sequence[Sequence[str]], apart: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Every metric over the questions (those of `apart` categories left out) and per category (3 places)."""

    def mean(rows: list[dict[str, float]]) -> dict[str, float]:
        return {m: round(sum(r[m] for r in rows) / max(len(rows), 1), 3) for m in METRICS}

    rows = [metrics(r, a.gold) for a, r in zip(asks, rankings, strict=True)]
    by: dict[str, list[dict[str, float]]] = {}
    for ask, row in zip(asks, rows, strict=True):
        by.setdefault(ask.category, []).append(row)
    counted = [row for ask, row in zip(asks, rows, strict=True) if ask.category not in apart]
    return {
        **mean(counted),
        "questions": len(counted),
        "by_category": {c: mean(r) | {"n": len(r)} for c, r in by.items()},
    }
