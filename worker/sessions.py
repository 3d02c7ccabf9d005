"""A session's extracted line, and which messages of a send are new to it.

Each persisted send of a session leaves the session's *line*: one short hash per message of that send. A new
send is extracted from the end of the longest prefix it shares with the line, so a history sent again costs
nothing, a grown history costs only its new messages, and an edited message is a new message (with what
follows it); the messages before it are not extracted twice.

The line can move between the extraction and its persist transaction (two sends of one session extracted
at once, or a retried short send after a longer one was persisted). The persist transaction locks the
line and calls `decide` again on what it finds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from worker.models import Message

Decision = Literal["save", "unchanged", "moved"]


def progress_key(user_id: str, session_id: str) -> str:
    return "sp_" + hashlib.sha256(f"{user_id}\x1f{session_id}".encode()).hexdigest()[:32]


def messages_digest(messages: Sequence[Message]) -> str:
    canonical = json.dumps([[m.role, m.content] for m in messages], ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def message_hashes(messages: Sequence[Message]) -> tuple[str, ...]:
    """One short hash per message (role and content): 64 bits, enough within one session."""
    return tuple(
        hashlib.sha256(json.dumps([m.role, m.content], ensure_ascii=False).encode("utf-8")).hexdigest()[:16]
        for m in messages
    )


@dataclass(frozen=True)
class StoredLine:
    """What the store holds for a session: the line's hashes (None for progress written before lines
    existed, which kept only a count and the digest of those messages)."""

    extracted: int
    digest: str
    hashes: tuple[str, ...] | None


@dataclass(frozen=True)
class WriteState:
    """What the extract stage reads before calling the model (Neo4jGraphStore.write_state)."""

    line: StoredLine | None
    erased_at: float  # epoch seconds of the user's last erasure, 0 if never
    episode_user: str | None  # owner of an episode already stored under this id
    episode_digest: str | None  # its source digest (None: no such episode, or stored before digests)
    forgotten_at: float = 0.0  # epoch seconds this episode or its session was last forgotten, 0 if never


def erased_since(accepted_at: float | None, erased_at: float) -> bool:
    """Was the user erased after this work was accepted? Work without an acceptance time comes from before
    erasure marks existed, so any mark is later than it."""
    return erased_at > 0 and (accepted_at or 0.0) <= erased_at


def common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def extracted_prefix(line: StoredLine | None, messages: Sequence[Message], hashes: Sequence[str]) -> int:
    """How many of the send's first messages the session already extracted."""
    if line is None:
        return 0
    if line.hashes is not None:
        return common_prefix(line.hashes, hashes)
    count = line.extracted  # progress from before lines: only the exact prefix it digested is known
    return count if 0 < count <= len(messages) and messages_digest(messages[:count]) == line.digest else 0


def decide(line: StoredLine | None, planned_start: int, hashes: Sequence[str]) -> Decision:
    """In the persist transaction, with the line locked: save the extraction, drop it (the line holds
    every message of the send already), or extract again (the line moved past where this extraction began,
    so saving it would count those messages twice)."""
    if not hashes:  # a payload from before lines existed
        return "save"
    if planned_start > 0 and (line is None or (line.hashes is None and line.extracted == 0)):
        return "moved"  # the line this plan stood on is gone (erased): what it took as extracted is not
    if line is None or line.hashes is None:  # a line from before hashes: only its count is known
        return "save"
    now = common_prefix(line.hashes, hashes)
    if now >= len(hashes):
        return "unchanged"
    return "moved" if now > planned_start else "save"
