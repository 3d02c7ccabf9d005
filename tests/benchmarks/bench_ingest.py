"""Ingestion benchmark: add_episode latency against a bare Redis LPUSH of the same size, and end-to-end
persisted episodes/s through real workers with an instantly answering stand-in LLM.

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_ingest)

Targets: add_episode p99 ≤ 10× LPUSH p99 (issue 4); ≥ 300 persisted episodes/s end to end with the offline
model on this 2-core machine, or, where Celery's own per-task cost makes that impossible, ≥ 80% of the rate of
the same number of no-op chains of the shape the worker runs (one task per episode, the default pools) through
the same broker settings, measured in the same run (issue 12). The two-task shape the write path had before is
measured too, for reference.
BENCH_EPISODES sets the episodes of each end-to-end round and the chains of each ceiling run (6,000 by default),
BENCH_MAX_ROUNDS the most end-to-end rounds (8): they go on until Neo4j is warm, and the target is judged on the
last (the first, on Neo4j as found, is reported too).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from api_stub.cli import DEFAULT_EXTRACT_PROCESSES, DEFAULT_EXTRACT_THREADS, DEFAULT_PERSIST_THREADS
from api_stub.client import MemoryClient
from tests.benchmarks import noop_app
from tests.benchmarks.common import latency_ms, neo4j_cpu_s, timed, write_results
from tests.services import ROOT, load_services_env
from tests.workers import WorkerProcess
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keys import EXTRACT_QUEUE, PERSIST_QUEUE
from worker.settings import Settings

LATENCY_SAMPLES = 2000
E2E_EPISODES = int(os.environ.get("BENCH_EPISODES", "6000"))
E2E_MAX_ROUNDS = max(2, int(os.environ.get("BENCH_MAX_ROUNDS", "8")))
STEADY_CHANGE = 0.05  # warm: Neo4j's CPU per episode (else the rate) moved less than this since the last round


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


def _persisted_rate(count: Callable[[], int], total: int, started: float) -> tuple[float, float]:
    """(episodes/s from `started`, episodes/s from the first persisted one) once `total` are counted."""
    first: float | None = None
    while (done := count()) < total:
        if done and first is None:
            first, first_done = time.perf_counter(), done
        if time.perf_counter() - started > 900:
            raise RuntimeError("the run did not finish in 15 minutes")
        time.sleep(0.05)
    ended = time.perf_counter()
    if first is None:
        first, first_done = started, 0
    return total / (ended - started), (total - first_done) / max(ended - first, 1e-9)


def bench_end_to_end(client: MemoryClient, store: Neo4jGraphStore) -> dict[str, Any]:
    """Rounds of E2E_EPISODES episodes, each enqueued first, then one `memctl worker` (defaults, offline
    model) started: persisted/s. Each round writes onto the store holding the earlier rounds' episodes (a
    store that already holds memory, as in use), with a worker of its own. A Neo4j just started costs about
    three times the CPU per episode of a warm one (7 against 2 ms here) until some 30,000 episodes have
    gone through: rounds go on until Neo4j's CPU per episode (the rate where that cannot be read) moves by
    less than STEADY_CHANGE from one round to the next, at most E2E_MAX_ROUNDS; the first round is a Neo4j
    as found, the last the steady state the target is judged on."""
    rounds: list[dict[str, float | None]] = []
    users: list[str] = []
    try:
        while len(rounds) < E2E_MAX_ROUNDS and not _steady(rounds):
            users.append(f"bench-e2e-{uuid.uuid4().hex[:8]}")
            rounds.append(_one_run(client, store, users[-1]))
    finally:
        for user in users:
            store.delete_user(user)
    first, last = rounds[0], rounds[-1]
    return {
        "episodes_per_round": E2E_EPISODES,
        "rounds": rounds,
        "steady": _steady(rounds),
        "persisted_per_s_from_worker_start": last["from_worker_start"],
        "persisted_per_s": last["steady"],
        "first_round_persisted_per_s_from_worker_start": first["from_worker_start"],
        "first_round_persisted_per_s": first["steady"],
        "shape": f"3 messages per episode, offline model, one memctl worker with defaults: {DEFAULT_EXTRACT_PROCESSES} "
        f"extract processes × {DEFAULT_EXTRACT_THREADS} threads, each writing its extraction inline (threads of a "
        "process share transactions of up to MEMORY_PERSIST_BATCH episodes); 2 cores; each round onto the store "
        "holding the earlier rounds' episodes; persisted_per_s is the last round's",
    }


def _steady(rounds: list[dict[str, float | None]]) -> bool:
    if len(rounds) < 2:
        return False
    before, last = rounds[-2], rounds[-1]
    measure = (
        "neo4j_cpu_ms_per_episode"
        if before["neo4j_cpu_ms_per_episode"] and last["neo4j_cpu_ms_per_episode"]
        else "steady"
    )
    old, new = before[measure] or 0.0, last[measure] or 0.0
    return old > 0 and abs(new - old) / old < STEADY_CHANGE


def _one_run(client: MemoryClient, store: Neo4jGraphStore, user: str) -> dict[str, float | None]:
    for i in range(E2E_EPISODES):
        client.add_episode(user, f"s{i}", messages(i))
    neo4j_cpu = neo4j_cpu_s()
    started = time.perf_counter()
    env = {**os.environ, "MEMORY_LLM_MODEL": "offline"}
    worker = WorkerProcess(Path(tempfile.mkdtemp()) / "worker.log", env, defaults=True).start()
    try:
        overall, steady = _persisted_rate(lambda: store.episode_count(user), E2E_EPISODES, started)
    finally:
        worker.stop()
    after = neo4j_cpu_s()
    per_episode = None if neo4j_cpu is None or after is None else (after - neo4j_cpu) / E2E_EPISODES * 1000
    return {
        "from_worker_start": round(overall, 1),
        "steady": round(steady, 1),
        "neo4j_cpu_ms_per_episode": None if per_episode is None else round(per_episode, 2),
    }


def bench_celery_ceiling(r: Any, first: Any, pools: list[tuple[str, int, int]]) -> dict[str, Any]:
    """The same number of chains `first` → `second` as no-ops (tests/benchmarks/noop_app.py: the real app's
    broker settings, queues of their own) on the given pools (queue, processes, threads each): what Celery
    alone allows on this machine for that shape."""
    r.delete(noop_app.DONE_KEY, noop_app.FIRST_QUEUE, noop_app.SECOND_QUEUE)
    for i in range(E2E_EPISODES):
        payload = {"id": f"e{i}", "messages": messages(i)}
        head = first.s(payload).set(queue=noop_app.FIRST_QUEUE)
        second = noop_app.second.s().set(queue=noop_app.SECOND_QUEUE, task_id=f"noop:e{i}")
        (head | second).apply_async()
    commands = [_noop_worker(q, threads, n) for q, processes, threads in pools for n in range(processes)]
    workers = [subprocess.Popen(command, cwd=ROOT) for command in commands]
    started = time.perf_counter()
    try:
        _, steady = _persisted_rate(lambda: int(r.get(noop_app.DONE_KEY) or 0), E2E_EPISODES, started)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
    r.delete(noop_app.DONE_KEY, noop_app.SECOND_QUEUE)
    shape = ", ".join(f"{q}: {processes} × {threads} threads" for q, processes, threads in pools)
    return {"chains": E2E_EPISODES, "chains_per_s": round(steady, 1), "pools": shape}


def _noop_worker(queue: str, threads: int, index: int) -> list[str]:
    name = f"{queue}-{index}@%h"
    return [
        *(sys.executable, "-m", "celery", "-A", "tests.benchmarks.noop_app", "worker", "-Q", queue),
        *("-P", "threads", "-c", str(threads), "-n", name, "-E", "--without-gossip", "--without-mingle"),
        *("-l", "WARNING"),
    ]


def main() -> None:
    load_services_env()
    settings = Settings.load()
    r = redis.Redis.from_url(settings.redis_url)
    if r.llen(EXTRACT_QUEUE) or r.llen(PERSIST_QUEUE):
        raise SystemExit("the queues are not empty: stop other workers or drain them before benchmarking")
    client = MemoryClient(settings)
    store = Neo4jGraphStore.from_settings(settings)
    store.ensure_schema()
    results: dict[str, Any] = {"enqueue": bench_enqueue(client, r)}
    results["end_to_end"] = bench_end_to_end(client, store)
    # The shape the worker runs: one task per episode (the extract task writes inline and ends its chain),
    # on the default `memctl worker` pools.
    extract_pool = (noop_app.FIRST_QUEUE, DEFAULT_EXTRACT_PROCESSES, DEFAULT_EXTRACT_THREADS)
    persist_pool = (noop_app.SECOND_QUEUE, 1, DEFAULT_PERSIST_THREADS)
    results["celery_ceiling"] = bench_celery_ceiling(r, noop_app.only, [extract_pool, persist_pool])
    # For reference, the shape before inline writes (issue 12's 250 chains/s): two tasks per episode.
    two = [(noop_app.FIRST_QUEUE, 1, 16), (noop_app.SECOND_QUEUE, 1, 32)]
    results["celery_ceiling_two_tasks"] = bench_celery_ceiling(r, noop_app.first, two)
    for name in ("celery_ceiling", "celery_ceiling_two_tasks"):
        ratio = results["end_to_end"]["persisted_per_s"] / results[name]["chains_per_s"]
        results["end_to_end"][f"ratio_to_{name}"] = round(ratio, 2)
    ratio = results["end_to_end"]["first_round_persisted_per_s"] / results["celery_ceiling"]["chains_per_s"]
    results["end_to_end"]["first_round_ratio_to_celery_ceiling"] = round(ratio, 2)
    results["targets"] = {
        "p99_ratio_to_lpush_max": 10,
        "persisted_per_s_min": 300,
        "or_ratio_to_celery_ceiling_min": 0.8,
    }
    write_results("bench_ingest", results)
    client.close()
    store.close()


if __name__ == "__main__":
    main()
