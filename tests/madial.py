"""MADial-Bench, Chinese half (He et al., NAACL 2025; MIT License) for measuring recall: read from where it lies
(../shared/datasets/madial-zh or MEMORY_BENCH_MADIAL_DIR, never copied into this repository). Each memory is one
episode of its user (the event as the user's message, its date as occurred_at); each dialogue asks with the turns
before its first test turn (`Name: text` lines) for the memories in `relevant-id`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets" / "madial-zh"
_TURN = re.compile(r'^<([^>]+)>:"?(.*?)"?\s*$', re.S)


@dataclass(frozen=True)
class Memory:
    id: str
    user: str
    occurred_at: datetime
    text: str


@dataclass(frozen=True)
class Dialogue:
    user: str
    text: str  # the turns before the first test turn
    gold: frozenset[str]  # memory ids


@dataclass(frozen=True)
class MadialSet:
    memories: list[Memory]
    dialogues: list[Dialogue]

    @property
    def users(self) -> list[str]:
        return sorted({m.user for m in self.memories})


def dataset_dir() -> Path:
    return Path(os.environ.get("MEMORY_BENCH_MADIAL_DIR") or DEFAULT_DIR)


def turns_text(lines: list[str]) -> str:
    """`<Name>:"…"` lines → `Name: …` lines (the markers <BOD>/<EOD> left out)."""
    out = []
    for line in lines:
        match = _TURN.match(line.strip())
        if match:
            out.append(f"{match.group(1)}: {match.group(2)}")
    return "\n".join(out)


def load_madial(directory: Path) -> MadialSet:
    memories_file, dialogues_file = directory / "memory.jsonl", directory / "dialogue.jsonl"
    if not memories_file.is_file() or not dialogues_file.is_file():
        raise FileNotFoundError(f"no MADial-Bench memory.jsonl and dialogue.jsonl in {directory}")
    memories = []
    for line in memories_file.read_text(encoding="utf-8").splitlines():
        if line.strip():
            ((_, item),) = json.loads(line).items()
            when = datetime.strptime(item["time"], "%Y-%m-%d").replace(tzinfo=UTC)
            memories.append(Memory(str(item["id"]), str(item["user-id"]), when, str(item["event"])))
    known = {m.id for m in memories}
    dialogues = []
    for line in dialogues_file.read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            gold = frozenset(str(i) for i in item["relevant-id"]) & known
            if gold and item["test-turn"]:
                text = turns_text(item["dialogue"][: item["test-turn"][0]])
                dialogues.append(Dialogue(str(item["user-id"]), text, gold))
    return MadialSet(memories, dialogues)
