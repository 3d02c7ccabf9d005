"""Crash recovery with the default settings: a `memctl worker` SIGKILLed (its whole process group) while it
holds messages, a replacement started; seconds until every accepted episode is persisted.

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_crash_recovery)

Target (issue 12): every episode persisted within 90 s of the replacement being up, exactly once, none
already persisted sent to the LLM again (as reported in the issue, before this: 292 of 300 after 15 minutes,
the rest at kombu's visibility timeout, an hour).
"""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import asdict
from pathlib import Path

import redis

from api_stub.client import MemoryClient
from tests import crash_recovery
from tests.benchmarks.common import write_results
from tests.llm_standin import StandIn
from tests.services import load_services_env
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keys import EXTRACT_QUEUE, KOMBU_UNACKED, PERSIST_QUEUE
from worker.settings import Settings

USERS, PER_USER = 3, 100


def main() -> None:
    load_services_env()
    settings = Settings.load()
    r = redis.Redis.from_url(settings.redis_url)
    if r.llen(EXTRACT_QUEUE) or r.llen(PERSIST_QUEUE) or r.hlen(KOMBU_UNACKED):
        raise SystemExit("the broker is not empty: stop other workers or drain them before benchmarking")
    client = MemoryClient(settings)
    store = Neo4jGraphStore.from_settings(settings)
    standin = StandIn().start()
    users = [f"bench-crash-{uuid.uuid4().hex[:8]}-{i}" for i in range(USERS)]
    try:
        outcome = crash_recovery.run(
            client,
            store,
            r,
            standin,
            users,
            PER_USER,
            Path(tempfile.mkdtemp()),
            llm_delay_s=1.0,
            held_before_kill=16,
            persisted_before_kill=50,
        )
    finally:
        standin.stop()
        for user in users:
            store.delete_user(user)
        client.close()
        store.close()
    exact = all(
        f["episodes"] == PER_USER and f["mentions"] == f["pairs"] == f["counters"] for f in outcome.facts.values()
    )
    results = {
        **{k: v for k, v in asdict(outcome).items() if k not in ("facts", "states")},
        "recovered_s": round(outcome.recovered_s, 1),
        "all_persisted": outcome.states == {"persisted"},
        "exactly_once": exact,
        "settings": "defaults: visibility 3600 s, sweep every 15 s, worker lost after 30 s",
        "shape": f"{USERS * PER_USER} episodes, stand-in LLM answering in 1 s, one memctl worker, 2 cores",
        "targets": {"recovered_s_max": 90},
    }
    write_results("bench_crash_recovery", results)


if __name__ == "__main__":
    main()
