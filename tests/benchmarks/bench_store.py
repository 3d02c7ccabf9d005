"""Graph-store benchmark: save throughput, the extract stage's read alone and in batches, and search latency
against the bare fulltext floor at 10k and 100k.

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_store)

Targets (issue 2): save ≥ 300 episodes/s in one process; search p95 ≤ 3× the bare fulltext p95;
search p95 at 100k ≤ 1.5× p95 at 10k. Each p95 is the median over ROUNDS rounds of queries, search and floor
interleaved query by query, so both see the same machine state.
Data: 1k users `bench-u####`, cleared at the start of every run.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.benchmarks.common import Corpus, measure_rounds, neo4j_cpu_s, summarise_rounds, timed, write_results
from tests.services import load_services_env
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.graph.params import EpisodeWrite
from worker.graph.state_reads import StateRequest
from worker.models import Entity, EpisodeRecord, Relationship
from worker.sessions import progress_key
from worker.settings import Settings

USERS = 1000
BATCH = 200
QUERIES = 200  # per round
ROUNDS = 9  # the reported p95 is the median of the rounds' p95, so one GC pause or merge cannot decide it
WARMUP = 300
READS = 4000  # write_state reads per pass
READ_BATCH = 8
SETTLE_S = 10  # after a bulk load, let Lucene finish merging segments before measuring


def episode(corpus: Corpus, user: int, n: int, run: str = "") -> EpisodeWrite:
    """Deterministic in (user, n, run), so a query can be built from any stored episode later."""
    rng = random.Random(f"{user}/{n}/{run}")
    user_id = f"bench-u{user:04d}"
    own_names = corpus.names[(user * 7) % 2900 : (user * 7) % 2900 + 40]
    names = rng.sample(own_names, 5)
    record = EpisodeRecord(
        id=f"bench-{run}ep-{user:04d}-{n:06d}",
        user_id=user_id,
        session_id=f"s{n % 10}",
        summary=f"{names[0]} {corpus.sentence(rng, 8)}",
        content=f"{names[0]} and {names[1]} {corpus.sentence(rng, 40)}",
        extraction="offline",
        model="offline",
        message_count=4,
    )
    entities = [Entity(name=x, type="person", description=corpus.sentence(rng, 6)) for x in names]
    rels = [Relationship(source=names[i], target=names[(i + 1) % 5], weight=0.5) for i in range(5)]
    return record, entities, rels


def bench_saves(store: Neo4jGraphStore, corpus: Corpus) -> dict[str, object]:
    run = f"{int(time.time())}-"
    sequential = [episode(corpus, 2000 + i % 50, i, run + "seq") for i in range(300)]
    threaded = [episode(corpus, 2000 + i % 50, i, run + "thr") for i in range(1200)]
    batched = [episode(corpus, 2000 + i % 50, i, run + "bat") for i in range(4000)]
    out: dict[str, object] = {}
    seconds = timed(lambda: [store.save_episode(*w) for w in sequential])
    out["one_per_transaction_1_thread_eps"] = round(len(sequential) / seconds, 1)
    with ThreadPoolExecutor(8) as pool:
        seconds = timed(lambda: list(pool.map(lambda w: store.save_episode(*w), threaded)))
    out["one_per_transaction_8_threads_eps"] = round(len(threaded) / seconds, 1)
    chunks = [batched[i : i + BATCH] for i in range(0, len(batched), BATCH)]
    seconds = timed(lambda: [store.save_episodes(c) for c in chunks])
    out[f"batches_of_{BATCH}_1_thread_eps"] = round(len(batched) / seconds, 1)
    out["shape"] = "5 entities + 5 relationships per episode"
    for user in range(2000, 2050):
        store.delete_user(f"bench-u{user:04d}")
    return out


def bench_reads(store: Neo4jGraphStore) -> dict[str, object]:
    """The read each extraction starts with (write_state): CPU per read, this process's and Neo4j's, one
    query per read against batches of READ_BATCH requests in one query (what GroupRead sends)."""
    user = "bench-reads"
    requests = [StateRequest(user, progress_key(user, f"s{i}"), f"ep{i}") for i in range(READS)]
    out: dict[str, object] = {}
    for name, size in (("alone", 1), (f"batches_of_{READ_BATCH}", READ_BATCH)):
        for _ in range(2):  # the first pass plans the query and warms the pools: the second is reported
            own, neo4j = time.process_time(), neo4j_cpu_s()
            for i in range(0, READS, size):
                store.write_states(requests[i : i + size])
            own_ms = (time.process_time() - own) * 1000 / READS
            after = neo4j_cpu_s()
            neo4j_ms = None if neo4j is None or after is None else (after - neo4j) * 1000 / READS
        out[name] = {
            "client_cpu_ms_per_read": round(own_ms, 3),
            "neo4j_cpu_ms_per_read": None if neo4j_ms is None else round(neo4j_ms, 3),
        }
    return out


def clear_population(store: Neo4jGraphStore) -> None:
    """Start from no bench users, so the 10k figure is measured at 10k; then give Neo4j time to finish the
    background work a mass delete leaves (index cleanup, checkpoint) before anything is timed."""
    started = time.perf_counter()
    for user in range(USERS):
        store.delete_user(f"bench-u{user:04d}")
    print(f"cleared bench users in {time.perf_counter() - started:.1f} s")
    time.sleep(3 * SETTLE_S)


def load(store: Neo4jGraphStore, corpus: Corpus, total: int) -> None:
    """Top the bench users up to `total` episodes, spread evenly."""
    per_user = total // USERS
    have = store.stats(f"bench-u{USERS - 1:04d}").episodes
    if have >= per_user:
        return
    started = time.perf_counter()
    writes = [episode(corpus, u, n) for n in range(have, per_user) for u in range(USERS)]
    for i in range(0, len(writes), BATCH):
        store.save_episodes(writes[i : i + BATCH])
    print(f"loaded {len(writes)} episodes in {time.perf_counter() - started:.1f} s")
    time.sleep(SETTLE_S)


def queries(corpus: Corpus, per_user: int) -> list[tuple[str, list[str], str]]:
    rng = random.Random(11)
    out = []
    for _ in range(QUERIES * ROUNDS + WARMUP):
        user = rng.randrange(USERS)
        record, entities, _ = episode(corpus, user, rng.randrange(per_user))
        words = [*rng.sample((record.content or "").split()[2:], 2), entities[0].name]
        out.append((record.user_id, words, " ".join(words)))
    return out


def bench_search(store: Neo4jGraphStore, corpus: Corpus, total: int) -> dict[str, Any]:
    load(store, corpus, total)
    asked = queries(corpus, total // USERS)
    for user_id, keywords, text in asked[:WARMUP]:
        store.search(user_id, keywords, text, 5)
    hits = 0

    def measure(item: tuple[str, list[str], str]) -> tuple[float, float]:
        nonlocal hits
        user_id, keywords, text = item
        started = time.perf_counter()
        hits += bool(store.search(user_id, keywords, text, 5).related_episodes)
        searched = time.perf_counter() - started
        return searched, timed(lambda: store.run_bare_fulltext(user_id, keywords, text))

    rounds = measure_rounds(asked[WARMUP:], ROUNDS, QUERIES, measure)
    return {
        "episodes": total,
        "users": USERS,
        "queries_per_round": QUERIES,
        **summarise_rounds("search", rounds),
        "queries_with_results": hits,
    }


def _p95(result: dict[str, Any]) -> float:
    return float(result["search_p95_ms_median"])


def main() -> None:
    load_services_env()
    store = Neo4jGraphStore.from_settings(Settings.load())
    store.ensure_schema()
    corpus = Corpus()
    clear_population(store)
    results: dict[str, object] = {"save": bench_saves(store, corpus), "write_state_reads": bench_reads(store)}
    at_10k = bench_search(store, corpus, 10_000)
    at_100k = bench_search(store, corpus, 100_000)
    results["search_10k"], results["search_100k"] = at_10k, at_100k
    results["p95_100k_over_10k"] = round(_p95(at_100k) / _p95(at_10k), 2)
    results["targets"] = {
        "save_eps_min": 300,
        "p95_ratio_to_floor_max": 3.0,
        "p95_100k_over_10k_max": 1.5,
    }
    write_results("bench_store", results)
    store.close()


if __name__ == "__main__":
    main()
