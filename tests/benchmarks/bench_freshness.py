"""Freshness: episodes offered at a steady rate (offline model, one `memctl worker`); for each, the time from
`add_episode` returning to the episode being in Neo4j (what recall reads), p50 and p95, and whether the
worker kept up with the rate (the backlog at the end of the offering).

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_freshness)
    BENCH_RATE=50 BENCH_SECONDS=60 for another rate or length.

Target (issue 12): at 50 episodes/s, p95 ≤ 2 s.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

from api_stub.client import MemoryClient
from tests.benchmarks.common import percentile, write_results
from tests.services import load_services_env
from tests.workers import WorkerProcess
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.settings import Settings

RATE = float(os.environ.get("BENCH_RATE", "50"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "60"))


def main() -> None:
    load_services_env()
    settings = Settings.load()
    client = MemoryClient(settings)
    store = Neo4jGraphStore.from_settings(settings)
    user = f"bench-fresh-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(Path(tempfile.mkdtemp()) / "worker.log", {**os.environ}, defaults=True).start()
    returned: dict[str, float] = {}
    seen: dict[str, float] = {}
    offering = threading.Event()
    offering.set()

    def watch() -> None:
        while offering.is_set() or len(seen) < len(returned):
            waiting = [i for i in list(returned) if i not in seen]
            if waiting:
                with store._session() as s:
                    found = s.run("MATCH (e:Episode) WHERE e.id IN $ids RETURN e.id", ids=waiting).value()
                now = time.perf_counter()
                for episode_id in found:
                    seen[episode_id] = now
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        started = time.perf_counter()
        total = int(RATE * SECONDS)
        for i in range(total):
            due = started + i / RATE
            if (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            messages = [{"role": "user", "content": f"My sister Anna visited Lisbon, visit {i}."}]
            receipt = client.add_episode(user, f"s{i}", messages)
            returned[receipt.episode_id] = time.perf_counter()
        offered_s = time.perf_counter() - started
        backlog_at_end = total - len(seen)
        offering.clear()
        watcher.join(timeout=900)
    finally:
        worker.stop()
        store.delete_user(user)
        store.close()
        client.close()
    delays = [seen[i] - returned[i] for i in returned if i in seen]
    results = {
        "rate_offered_per_s": RATE,
        "achieved_offer_rate_per_s": round(total / offered_s, 1),
        "episodes": total,
        "persisted": len(delays),
        "backlog_at_end_of_offering": backlog_at_end,
        "to_persisted_p50_s": round(percentile(delays, 50), 3) if delays else None,
        "to_persisted_p95_s": round(percentile(delays, 95), 3) if delays else None,
        "to_persisted_max_s": round(max(delays), 3) if delays else None,
        "shape": "one message per episode, offline model, one memctl worker (defaults), 2 cores",
        "targets": {"p95_s_max": 2.0, "at_rate_per_s": 50},
    }
    write_results("bench_freshness", results)


if __name__ == "__main__":
    main()
