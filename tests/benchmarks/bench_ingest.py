"""Ingestion benchmark: add_episode latency against a bare Redis LPUSH of the same size, and end-to-end
persisted episodes/s through real workers with an instantly answering stand-in LLM.

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_ingest)

Targets (issue 4): add_episode p99 ≤ 10× LPUSH p99; ≥ 300 persisted episodes/s on this 2-core machine.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from api_stub.client import MemoryClient
from tests.benchmarks.common import latency_ms, timed, write_results
from tests.llm_standin import StandIn, answer
from tests.services import load_services_env
from tests.workers import WorkerProcess, worker_env
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keys import EXTRACT_QUEUE, PERSIST_QUEUE
from worker.settings import Settings

LATENCY_SAMPLES = 2000
E2E_EPISODES = 1500
ANSWER = {
    "summary": "The user talked about five people and how they know each other.",
    "entities": [{"name": f"Person {i}", "type": "person", "description": "a friend"} for i in range(5)],
    "relationships": [
        {"source": f"Person {i}", "target": f"Person {(i + 1) % 5}", "description": "knows", "weight": 0.5}
        for i in range(5)
    ],
}


def messages(i: int) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Yesterday I had lunch with five friends, conversation number {i}."},
        {"role": "assistant", "content": "That sounds like a lot of fun. What did you talk about?"},
        {"role": "user", "content": "Mostly about travel plans for the summer and a new job one of them got."},
    ]


def bench_enqueue(client: MemoryClient, r: Any) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    client.add_episode(f"bench-lat-{run}", "probe", messages(0))
    payload = r.lindex(EXTRACT_QUEUE, 0)  # the real message as it sits in Redis: LPUSH the same bytes
    for i in range(100):  # warm the connection pools
        client.add_episode(f"bench-lat-{run}", f"w{i}", messages(i))
        r.lpush("bench:lpush", payload)
    enqueue = []
    for i in range(LATENCY_SAMPLES):
        conversation = messages(i)
        started = time.perf_counter()
        client.add_episode(f"bench-lat-{run}", f"s{i}", conversation)
        enqueue.append(time.perf_counter() - started)
    lpush = [timed(lambda: r.lpush("bench:lpush", payload)) for _ in range(LATENCY_SAMPLES)]
    r.delete("bench:lpush", EXTRACT_QUEUE)
    a, b = latency_ms(enqueue), latency_ms(lpush)
    return {
        "add_episode": a,
        "bare_lpush_same_size": b,
        "payload_bytes": len(payload),
        "p99_ratio_to_lpush": round(a["p99_ms"] / b["p99_ms"], 2),
    }


def bench_end_to_end(client: MemoryClient, store: Neo4jGraphStore) -> dict[str, Any]:
    standin = StandIn().start()
    standin.default = lambda _request: answer(ANSWER)
    user = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    env = worker_env(MEMORY_LLM_MODEL="openai/stand-in", MEMORY_LLM_API_BASE=standin.url, MEMORY_LLM_API_KEY="sk-bench")
    worker = WorkerProcess(Path(tempfile.mkdtemp()) / "worker.log", env).start()
    try:
        started = time.perf_counter()
        for i in range(E2E_EPISODES):
            client.add_episode(user, f"s{i}", messages(i))
        enqueued_s = time.perf_counter() - started
        while store.stats(user).episodes < E2E_EPISODES:
            time.sleep(0.25)
            if time.perf_counter() - started > 900:
                raise RuntimeError("end-to-end run did not finish in 15 minutes")
        seconds = time.perf_counter() - started
    finally:
        worker.stop()
        standin.stop()
    store.delete_user(user)
    return {
        "episodes": E2E_EPISODES,
        "persisted_per_s": round(E2E_EPISODES / seconds, 1),
        "enqueue_all_s": round(enqueued_s, 2),
        "llm_calls": standin.calls,
        "shape": "3 messages; stand-in answers at once with 5 entities + 5 relationships",
        "workers": "memctl worker defaults (extract: 16 threads, persist: 4 threads), one machine, 2 cores",
    }


def main() -> None:
    load_services_env()
    settings = Settings.load()
    r = redis.Redis.from_url(settings.redis_url)
    if r.llen(EXTRACT_QUEUE) or r.llen(PERSIST_QUEUE):
        raise SystemExit("the queues are not empty: stop other workers or drain them before benchmarking")
    client = MemoryClient(settings)
    store = Neo4jGraphStore.from_settings(settings)
    store.ensure_schema()
    results = {"enqueue": bench_enqueue(client, r), "end_to_end": bench_end_to_end(client, store)}
    results["targets"] = {"p99_ratio_to_lpush_max": 10, "persisted_per_s_min": 300}
    write_results("bench_ingest", results)
    client.close()
    store.close()


if __name__ == "__main__":
    main()
