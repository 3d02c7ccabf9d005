"""LoCoMo-format conversations (Maharana et al., ACL 2024; CC BY-NC 4.0) for measuring recall: read from
where they lie (never copied into this repository), stored one user per conversation and one episode per
session through the real queue and worker, and scored by session recall_any@k.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from worker.models import MemoryContext

DEFAULT_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets" / "locomo-dev"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}  # 5 (adversarial) left out
_SESSION = re.compile(r"session_(\d+)")
_EVIDENCE = re.compile(r"D(\d+):")


@dataclass(frozen=True)
class Session:
    number: int
    occurred_at: datetime
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class Question:
    text: str
    gold: frozenset[int]  # session numbers named by the evidence
    category: int


@dataclass(frozen=True)
class Conversation:
    name: str
    sessions: list[Session]
    questions: list[Question]


def dataset_dir() -> Path:
    return Path(os.environ.get("MEMORY_BENCH_LOCOMO_DIR") or DEFAULT_DIR)


def message_text(turn: dict[str, Any]) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


def load_conversation(path: Path) -> Conversation:
    raw = json.loads(path.read_text(encoding="utf-8"))
    sessions = []
    for key, turns in raw.items():
        match = _SESSION.fullmatch(key)
        if match and isinstance(turns, list) and turns:
            number = int(match.group(1))
            when = datetime.strptime(raw[f"{key}_date_time"], "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
            messages = [{"role": "user", "content": message_text(t)} for t in turns]
            sessions.append(Session(number, when, messages))
    numbers = {s.number for s in sessions}
    questions = []
    for qa in raw["qa"]:
        gold = frozenset(int(n) for ev in qa.get("evidence", []) for n in _EVIDENCE.findall(str(ev))) & numbers
        if qa["category"] in CATEGORIES and gold:
            questions.append(Question(str(qa["question"]), gold, int(qa["category"])))
    return Conversation(path.stem, sorted(sessions, key=lambda s: s.number), questions)


def load_conversations(directory: Path, only: int | None = None) -> list[Conversation]:
    files = sorted(directory.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no LoCoMo conversations (*.json) in {directory}")
    return [load_conversation(f) for f in files[:only]]


def session_id(number: int) -> str:
    return f"session_{number}"


Retrieve = Callable[[str, str, int], MemoryContext]


@dataclass
class Scores:
    hits: dict[int, int]  # k → questions with a gold session in the first k
    by_category: dict[int, list[int]]  # category → [hits@5, questions]
    questions: int = 0

    def at(self, k: int) -> float:
        return round(self.hits[k] / max(self.questions, 1), 3)

    def summary(self) -> dict[str, Any]:
        return {
            **{f"recall_any@{k}": self.at(k) for k in sorted(self.hits)},
            "by_category@5": {CATEGORIES[c]: round(h / n, 3) for c, (h, n) in sorted(self.by_category.items()) if n},
            "questions": self.questions,
        }


def score(
    conversations: Sequence[Conversation],
    user_of: Callable[[Conversation], str],
    retrieve: Retrieve,
    ks: Sequence[int] = (5, 10),
) -> Scores:
    """Session recall_any@k: a question counts when one of its gold sessions is among the first k."""
    deepest = max(ks)
    result = Scores({k: 0 for k in ks}, {c: [0, 0] for c in CATEGORIES})
    for conversation in conversations:
        user = user_of(conversation)
        for question in conversation.questions:
            ranked = [_number(h.session_id) for h in retrieve(user, question.text, deepest).related_episodes]
            result.questions += 1
            for k in ks:
                result.hits[k] += bool(set(ranked[:k]) & question.gold)
            cell = result.by_category[question.category]
            cell[0] += bool(set(ranked[:5]) & question.gold)
            cell[1] += 1
    return result


def _number(session: str) -> int:
    return int(session.rsplit("_", 1)[1])
