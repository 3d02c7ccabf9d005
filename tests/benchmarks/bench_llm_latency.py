"""Throughput at a real LLM's latency: the stand-in answers every extraction after 2 s; one `memctl worker`
with enough extract threads to keep 100+ calls in flight; episodes persisted per second at steady state and
the worker's memory (resident set of its whole process group, sampled every second).

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_llm_latency)

Target (issue 12): ≥ 50 episodes/s with 2 s per call, memory bounded and stated. BENCH_EPISODES=N for a
shorter run.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from api_stub.client import MemoryClient
from tests.benchmarks.common import write_results
from tests.ingest_helpers import graph_facts
from tests.llm_standin import Reply, StandIn
from tests.services import load_services_env
from tests.workers import WorkerProcess
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.settings import Settings

EPISODES = int(os.environ.get("BENCH_EPISODES", "3000"))
LLM_DELAY_S = 2.0
EXTRACT_THREADS = 160
EXTRACT_PROCESSES = int(os.environ.get("BENCH_EXTRACT_PROCESSES", "2"))
ANSWER = {"summary": "met people", "entities": [{"name": "Anna", "type": "person"}, {"name": "Lisbon"}]}


def group_rss_mb(pgid: int) -> float:
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ProcessLookupError, ValueError):
            continue
    return total / 1024


def main() -> None:
    load_services_env()
    settings = Settings.load()
    client = MemoryClient(settings)
    store = Neo4jGraphStore.from_settings(settings)
    standin = StandIn().start()
    standin.default = lambda _request: Reply(content=json.dumps(ANSWER), delay_s=LLM_DELAY_S)
    user = f"bench-latency-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MEMORY_LLM_MODEL": "openai/stand-in",
        "MEMORY_LLM_API_BASE": standin.url,
        "MEMORY_LLM_API_KEY": "sk-bench",
    }
    logs = Path(tempfile.mkdtemp())
    threads = str(EXTRACT_THREADS // EXTRACT_PROCESSES)
    args = ("--extract-concurrency", threads, "--extract-processes", str(EXTRACT_PROCESSES))
    worker = WorkerProcess(logs / "worker.log", env, *args).start()
    assert worker.process is not None
    rss: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            rss.append(group_rss_mb(worker.process.pid))  # type: ignore[union-attr]

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    timeline: list[tuple[float, int]] = []
    try:
        started = time.perf_counter()
        receipts = client.add_episodes(
            {"user_id": user, "session_id": f"s{i}", "messages": [{"role": "user", "content": f"I met Anna, {i}."}]}
            for i in range(EPISODES)
        )
        while (done := graph_facts(store, user)["episodes"]) < EPISODES:
            timeline.append((time.perf_counter() - started, done))
            if time.perf_counter() - started > 900:
                raise RuntimeError("the run did not finish in 15 minutes")
            time.sleep(1.0)
        seconds = time.perf_counter() - started
        states = {s.state for s in client.wait(receipts, timeout_s=60)}
    finally:
        stop.set()
        worker.stop()
        standin.stop()
        store.delete_user(user)
        store.close()
        client.close()
    results: dict[str, Any] = {
        "episodes": EPISODES,
        "llm_delay_s": LLM_DELAY_S,
        "extract_threads": EXTRACT_THREADS,
        "extract_processes": EXTRACT_PROCESSES,
        "persisted_per_s": round(EPISODES / seconds, 1),
        "steady_persisted_per_s": round(_steady_rate(timeline), 1),
        "llm_calls": standin.calls,
        "all_persisted": states == {"persisted"},
        "worker_rss_mb_max": round(max(rss), 1) if rss else None,
        "worker_rss_mb_last": round(rss[-1], 1) if rss else None,
        "shape": "one message per episode, one memctl worker (extract + persist), 2 cores",
        "targets": {"persisted_per_s_min": 50},
    }
    write_results("bench_llm_latency", results)


def _steady_rate(timeline: list[tuple[float, int]]) -> float:
    """Episodes/s between 20% and 80% of the run (start-up and tail left out)."""
    if len(timeline) < 3:
        return 0.0
    low = [p for p in timeline if p[1] >= 0.2 * EPISODES]
    high = [p for p in timeline if p[1] <= 0.8 * EPISODES]
    if not low or not high or high[-1][0] <= low[0][0]:
        return 0.0
    return (high[-1][1] - low[0][1]) / (high[-1][0] - low[0][0])


if __name__ == "__main__":
    main()
