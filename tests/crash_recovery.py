"""A worker's whole process group SIGKILLed mid-run, then a replacement started, with the default recovery
settings (visibility timeout one hour, sweep every 15 s, a worker lost after 30 s of silence): the scenario
behind tests/test_crash_recovery.py and tests/benchmarks/bench_crash_recovery.py."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api_stub.client import MemoryClient
from tests.ingest_helpers import graph_facts, wait_until
from tests.llm_standin import Reply, StandIn
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keys import KOMBU_UNACKED

ANSWER = {"summary": "met people", "entities": [{"name": "Anna", "type": "person"}, {"name": "Lisbon"}]}


def default_recovery_env(standin: StandIn) -> dict[str, str]:
    """The environment without the tests' short timings: recovery runs on the shipped defaults."""
    return {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MEMORY_LLM_MODEL": "openai/stand-in",
        "MEMORY_LLM_API_BASE": standin.url,
        "MEMORY_LLM_API_KEY": "sk-x",
    }


@dataclass
class Outcome:
    episodes: int
    held_at_kill: int  # messages the killed worker had received and not acknowledged
    persisted_at_kill: int
    recovered_s: float  # from the replacement being up to every episode persisted
    states: set[str]
    facts: dict[str, dict[str, Any]]  # graph_facts per user
    unacked_after: int
    llm_calls_again_for_persisted: int  # LLM calls, after the kill, for episodes persisted before it
    llm_calls_max_per_episode: int


def run(
    client: MemoryClient,
    store: Neo4jGraphStore,
    redis: RedisClient,
    standin: StandIn,
    users: list[str],
    per_user: int,
    logs: Path,
    llm_delay_s: float = 1.0,
    held_before_kill: int = 8,
    persisted_before_kill: int = 5,
    timeout_s: float = 300,
) -> Outcome:
    standin.default = lambda _request: Reply(content=json.dumps(ANSWER), delay_s=llm_delay_s)
    items = [
        {"user_id": users[k % len(users)], "session_id": f"s{k}", "messages": _said(k)}
        for k in range(per_user * len(users))
    ]
    env = default_recovery_env(standin)
    first = WorkerProcess(logs / "first.log", env).start()
    try:
        receipts = client.add_episodes(items)
        wait_until(
            lambda: (
                len(_episode_ids(store, users)) >= persisted_before_kill
                and redis.hlen(KOMBU_UNACKED) >= held_before_kill
            ),
            180,  # litellm's import and a cold Neo4j's first transactions come first
            "a run under way: episodes persisted and messages held",
        )
    finally:
        first.kill()  # whatever happened: a worker left running would take the next test's messages
    held = int(redis.hlen(KOMBU_UNACKED))
    note_of = {r.episode_id: _note(k) for k, r in enumerate(receipts)}
    persisted_ids = _episode_ids(store, users)
    calls_at_kill = len(standin.requests)
    second = WorkerProcess(logs / "second.log", env).start()
    up = time.monotonic()
    try:
        states = client.wait(receipts, timeout_s=timeout_s)
        recovered_s = time.monotonic() - up
    finally:
        second.stop()
    persisted_notes = {note_of[i] for i in persisted_ids if i in note_of}
    notes_asked = [_note_in(r) for r in standin.requests]
    per_episode: dict[str, int] = {}
    for note in notes_asked:
        per_episode[note] = per_episode.get(note, 0) + 1
    return Outcome(
        episodes=len(items),
        held_at_kill=held,
        persisted_at_kill=len(persisted_ids),
        recovered_s=recovered_s,
        states={s.state for s in states},
        facts={u: graph_facts(store, u) for u in users},
        unacked_after=int(redis.hlen(KOMBU_UNACKED)),
        llm_calls_again_for_persisted=sum(1 for n in notes_asked[calls_at_kill:] if n in persisted_notes),
        llm_calls_max_per_episode=max(per_episode.values()),
    )


def _note(k: int) -> str:
    return f"note {k:05d}"


def _said(k: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"I met Anna in Lisbon, {_note(k)}."}, {"role": "assistant", "content": "ok"}]


def _note_in(request: dict[str, object]) -> str:
    found = re.search(r"note \d{5}", json.dumps(request))
    return found.group(0) if found else ""


def _episode_ids(store: Neo4jGraphStore, users: list[str]) -> set[str]:
    with store._session() as s:
        return set(s.run("MATCH (e:Episode) WHERE e.user_id IN $us RETURN e.id", us=users).value())
