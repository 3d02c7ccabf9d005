"""What a persist transaction checks, under locks, before it writes an episode.

1. Erasure: the user's mark is locked; an episode accepted before the user's last erasure, or before its
   episode or session was last forgotten (worker/graph/forget.py), is dropped ("forgotten"), so work queued
   or retrying when `forget_user` / `forget_episode` / `forget_session` ran never writes after it.
2. The session's line is locked and the extraction's plan checked again (worker/sessions.py): a send
   whose messages the line already holds is dropped ("unchanged"); one whose line moved past where its
   extraction began must be extracted again ("moved").
Episode-id conflicts are found by the claim itself (see Neo4jGraphStore.save_episodes).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from neo4j import ManagedTransaction

from worker.graph import cypher
from worker.graph.forget import tombstones
from worker.graph.params import EpisodeWrite
from worker.identity import user_tag
from worker.models import SaveOutcome, SessionProgress
from worker.sessions import StoredLine, decide, erased_since


def check_writes(
    tx: ManagedTransaction, writes: Sequence[EpisodeWrite], progress: Mapping[str, SessionProgress]
) -> dict[str, SaveOutcome]:
    """The episodes of the batch that must not be written, with why; `progress` maps an episode id to the
    line its send leaves. Locks are taken in a fixed order (user tags, then progress keys, sorted)."""
    now = time.time()
    tags = sorted({user_tag(record.user_id) for record, _, _ in writes})
    erased: dict[str, float] = {}
    erasing: set[str] = set()
    for row in tx.run(cypher.LOCK_USERS, tags=tags, now=now):
        if float(row["erasing_until"]) > now:
            erasing.add(row["tag"])  # only this user's episodes wait; the rest of a batch is written
        erased[row["tag"]] = float(row["erased_at"])
    refused: dict[str, SaveOutcome] = {}
    forgotten = _forgotten_at(tx, writes)
    for record, _, _ in writes:
        if user_tag(record.user_id) in erasing:
            refused[record.id] = "erasing"
        elif erased_since(  # the user erased, or the episode or its session forgotten, after it was accepted
            record.accepted_at, max(erased.get(user_tag(record.user_id), 0.0), forgotten.get(record.id, 0.0))
        ):
            refused[record.id] = "forgotten"
    rows = sorted(
        {p.key: p for episode_id, p in progress.items() if episode_id not in refused}.values(), key=lambda p: p.key
    )
    if not rows:
        return refused
    lines: dict[str, StoredLine] = {}
    for row in tx.run(cypher.LOCK_PROGRESS, rows=[_lock_row(p) for p in rows], now=now):
        hashes = row["hashes"]
        lines[row["key"]] = StoredLine(
            int(row["extracted"] or 0), str(row["digest"] or ""), None if hashes is None else tuple(hashes)
        )
    for episode_id, p in sorted(progress.items()):
        if episode_id in refused:
            continue
        decision = decide(lines.get(p.key), p.start, p.hashes)
        if p.erased_at < erased.get(user_tag(p.user_id), 0.0):
            decision = "moved"  # planned on a line an erasure has deleted since: plan again
        if decision != "save":
            refused[episode_id] = decision
        else:  # a later send of the same session in this batch is checked against this one's line
            lines[p.key] = StoredLine(p.extracted, p.digest, p.hashes)
    return refused


def _forgotten_at(tx: ManagedTransaction, writes: Sequence[EpisodeWrite]) -> dict[str, float]:
    """Episode id → when it (or its session) was last forgotten; read under the user's lock, which a forget
    takes too, so a forget either committed before this transaction (and is seen) or waits for it."""
    keys = {record.id: tombstones(record.user_id, record.id, record.session_id) for record, _, _ in writes}
    at = {
        row["key"]: float(row["at"])
        for row in tx.run(cypher.FORGOTTEN_AT, keys=sorted({k for ks in keys.values() for k in ks}))
    }
    return {episode_id: max((at.get(k, 0.0) for k in ks), default=0.0) for episode_id, ks in keys.items()}


def _lock_row(p: SessionProgress) -> dict[str, Any]:
    return {"key": p.key, "user_id": p.user_id, "session_id": p.session_id}
