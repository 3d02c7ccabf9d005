"""LoCoMo-format conversations (Maharana et al., ACL 2024; CC BY-NC 4.0) for measuring recall: read from
where they lie (never copied into this repository): one user per conversation, one episode per session
(tests/benchmarks/recall_sets.py scores them).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
