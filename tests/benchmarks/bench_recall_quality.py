"""Recall quality on every dev set in one run: LoCoMo (English), MADial-Bench zh (Chinese) and the relevance
set, stored through the real queue and a real `memctl worker` (offline model), asked through recall with the
default settings, without and then with embeddings (a local e5 server through litellm, as production calls a
provider). The BM25 references of each set are computed by the same run (recall_sets.py).

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_recall_quality)

Prints, per set and per category, recall_any@5/@10, R-precision, hit@1 and all-gold@5 for the defaults, each
ablation and each reference; then the leave-one-dataset-out check: the weighting of a small grid that is best on
one set, measured on the others, and how far the defaults are from the best of each. Each weighting fuses the
same candidate read (fusion is a pure function). JSON under tests/benchmarks/results/.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from itertools import product
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from redis import Redis

from api_stub.client import MemoryClient
from api_stub.recall import Recall
from tests.benchmarks.common import latency_ms, write_results
from tests.benchmarks.recall_sets import RecallSet, all_sets, summary
from tests.servers import embedding_env, embedding_server
from tests.services import load_services_env
from tests.workers import WorkerProcess, worker_env
from worker.graph.fusion import FusionWeights, fuse
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.identity import user_tag
from worker.keys import keywords_cache_pattern
from worker.keywords import KeywordExtractor
from worker.query_embedding import QueryEmbedder
from worker.settings import Settings

DEPTH = 10  # every ranking is asked for this many; metrics read its first 5 / 10


def ablations(default: FusionWeights) -> dict[str, FusionWeights]:
    """Each signal left out (or added, for the ones off by default), against the defaults."""
    rows = {
        "windows only": FusionWeights(episodes=0, period=0, dense=0),
        "without whole-episode BM25": replace(default, episodes=0),
        "without the period": replace(default, period=0),
    }
    if default.dense > 0:
        rows["without embeddings"] = replace(default, dense=0)
        rows["embeddings only"] = FusionWeights(windows=0, episodes=0, period=0, dense=1)
    return rows


def grid(default: FusionWeights) -> dict[str, FusionWeights]:
    """The weightings the leave-one-dataset-out check chooses among."""
    out = {}
    dense = (0.5, 1.0, 2.0) if default.dense > 0 else (0.0,)
    for episodes, period, k, d in product((0.5, 1.0, 2.0), (0.5, 1.0, 2.0), (20, 60), dense):
        w = FusionWeights(windows=1.0, episodes=episodes, period=period, dense=d, k=k)
        out[f"episodes {episodes} period {period} k {k} dense {d}"] = w
    return out


def ingest(
    client: MemoryClient, sets: Sequence[RecallSet], user_of: dict[tuple[str, str], str]
) -> tuple[dict[str, str], float]:
    """Every episode through add_episode and a real worker; returns episode id → key, and the seconds taken."""
    started = time.perf_counter()
    receipts, keys = [], {}
    for data in sets:
        for item in data.items:
            receipt = client.add_episode(
                user_of[(data.name, item.user)], item.session, item.messages, occurred_at=item.occurred_at
            )
            receipts.append(receipt)
            keys[receipt.episode_id] = item.key
    states = client.wait(receipts, timeout_s=3600)  # embeddings on 2 shared cores take minutes
    failed = [s for s in states if s.state != "persisted"]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes were not persisted: {failed[:3]}")
    return keys, time.perf_counter() - started


def _keys(ids: Sequence[str], keys: dict[str, str]) -> list[str]:
    return [keys.get(i, "?") for i in ids]


def score_set(
    data: RecallSet, recall: Recall, store: Neo4jGraphStore, user_of: dict[tuple[str, str], str], keys: dict[str, str]
) -> dict[str, Any]:
    """The defaults through recall (the product's path), then every ablation and grid weighting on the same
    candidates, then the references."""
    default = store.weights
    weightings = {**ablations(default), **grid(default)}
    product_rankings: list[list[str]] = []
    fused: dict[str, list[list[str]]] = {n: [] for n in weightings}
    latencies: list[float] = []
    first_five = True
    for ask in data.asks:
        user = user_of[(data.name, ask.user)]
        started = time.perf_counter()
        context = recall.retrieve(user, ask.text, limit=DEPTH, budget_ms=20_000)
        latencies.append(time.perf_counter() - started)
        if context.degraded:
            raise RuntimeError(f"degraded recall: {context.reason}")
        ranked = _keys([h.id for h in context.related_episodes], keys)
        product_rankings.append(ranked)
        five = _keys([h.id for h in recall.retrieve(user, ask.text, limit=5, budget_ms=20_000).related_episodes], keys)
        first_five &= five == ranked[:5]
        found = recall.candidates(user, ask.text, budget_ms=20_000)
        for name, w in weightings.items():
            fused[name].append(_keys([r.id for r in fuse(found, w, DEPTH)], keys) if found else [])
    out: dict[str, Any] = {
        "default": summary(data.asks, product_rankings, data.apart),
        "latency": latency_ms(latencies),
    }
    out["limit_5_equals_first_5_of_limit_10"] = first_five
    out["ablations"] = {n: summary(data.asks, fused[n], data.apart) for n in ablations(default)}
    out["grid"] = {n: summary(data.asks, fused[n], data.apart)["recall_any@5"] for n in grid(default)}
    out["references"] = {}
    for name, build in data.references.items():
        rank = build(data)
        out["references"][name] = summary(data.asks, [rank(a) for a in data.asks], data.apart)
    if default.dense > 0:  # a plain fusion of the best reference and the embeddings alone, as a floor
        best = max(out["references"], key=lambda n: out["references"][n]["recall_any@5"])
        rank = data.references[best](data)
        dense_only = fused["embeddings only"]
        plain = [_rrf([rank(a), d]) for a, d in zip(data.asks, dense_only, strict=True)]
        out["references"][f"rrf of '{best}' and embeddings only"] = summary(data.asks, plain, data.apart)
    return out


def _rrf(lists: Sequence[Sequence[str]], k: int = 60) -> list[str]:
    total: dict[str, float] = {}
    for ranking in lists:
        for rank, key in enumerate(ranking, 1):
            total[key] = total.get(key, 0.0) + 1 / (k + rank)
    return sorted(total, key=lambda key: (-total[key], key))


def leave_one_out(results: dict[str, Any], sets: Sequence[str]) -> dict[str, Any]:
    """For each set: the grid's best weighting on it alone, what that weighting scores on each other set
    against that set's own best, and the defaults' distance to the best of each set."""
    out: dict[str, Any] = {}
    for fitted in sets:
        scores = results[fitted]["grid"]
        best = max(scores, key=lambda n: (scores[n], n))
        out[f"best on {fitted}"] = {
            "weighting": best,
            **{s: {"score": results[s]["grid"][best], "best there": max(results[s]["grid"].values())} for s in sets},
        }
    out["defaults below the best, points"] = {
        s: round(100 * (max(results[s]["grid"].values()) - results[s]["default"]["recall_any@5"]), 1) for s in sets
    }
    out["defaults within 1 point everywhere"] = all(v <= 1.0 for v in out["defaults below the best, points"].values())
    return out


def run(sets: Sequence[RecallSet], settings: Settings, embeddings: bool = False) -> dict[str, Any]:
    """Ingest every set with a fresh worker (and, with embeddings, a local e5 server), score, clean up."""
    prefix = f"rq-{uuid.uuid4().hex[:6]}"
    user_of = {(d.name, i.user): f"{prefix}-{d.name}-{i.user}" for d in sets for i in d.items}
    logs = Path(tempfile.mkdtemp())
    server = embedding_server(logs / "e5.log").start() if embeddings else None
    env = embedding_env(server) if server else {}
    if server:
        update: dict[str, Any] = {k.removeprefix("MEMORY_").lower(): v for k, v in env.items()}
        update["embedding_api_key"] = SecretStr(update["embedding_api_key"])
        update["embedding_budget_ms"] = 20_000  # measure ranking, not whether a cold query beat 300 ms
        settings = settings.model_copy(update=update)
    client = MemoryClient(settings)
    store = Neo4jGraphStore.from_settings(settings)
    store.ensure_schema()
    redis = Redis.from_url(settings.redis_url)
    recall = Recall(settings, store, KeywordExtractor(settings), QueryEmbedder(settings, redis=redis))
    # One local model on 2 cores answers one request at a time: two extract threads keep it busy without
    # piling up requests that time out (issue 34 is about making the defaults hold there).
    worker_args = ("--extract-concurrency", "2") if server else ()
    worker = WorkerProcess(
        logs / "worker.log",
        worker_env(MEMORY_LLM_MODEL="offline", MEMORY_EMBEDDING_TIMEOUT_S="300", **env),
        *worker_args,
    ).start()
    try:
        keys, ingest_s = ingest(client, sets, user_of)
        results: dict[str, Any] = {"ingest_s": round(ingest_s, 1), "weights": str(store.weights)}
        for data in sets:
            results[data.name] = score_set(data, recall, store, user_of, keys)
        results["leave_one_dataset_out"] = leave_one_out(results, [d.name for d in sets])
    finally:
        worker.stop()
        if server:
            server.stop()
        for user in user_of.values():
            store.delete_user(user)
            for key in redis.scan_iter(keywords_cache_pattern(user_tag(user))):  # query vectors too
                redis.delete(key)
        recall.close()
        client.close()
        redis.close()
    return results


def table(name: str, results: dict[str, Any]) -> str:
    """The figures of one run as text: each set, the defaults, ablations and references, then the check."""
    lines = [f"== {name} =="]
    for set_name, r in results.items():
        if not isinstance(r, dict) or "default" not in r:
            continue
        lines.append(
            f"-- {set_name}: {r['default']['questions']} questions; recall p50/p95 "
            f"{r['latency']['p50_ms']}/{r['latency']['p95_ms']} ms"
        )
        rows = {"DEFAULT": r["default"], **r["ablations"], **{f"ref: {k}": v for k, v in r["references"].items()}}
        for label, s in rows.items():
            lines.append(
                f"  {label[:62]:62s} @5 {s['recall_any@5']:.3f}  @10 {s['recall_any@10']:.3f}  "
                f"Rp {s['r_precision']:.3f}  h@1 {s['hit@1']:.3f}  all@5 {s['all_gold@5']:.3f}"
            )
        for cat, s in r["default"]["by_category"].items():
            lines.append(
                f"     {cat:24s} n {s['n']:4d}  @5 {s['recall_any@5']:.3f}  Rp {s['r_precision']:.3f}  "
                f"h@1 {s['hit@1']:.3f}  all@5 {s['all_gold@5']:.3f}"
            )
    for key, value in results.get("leave_one_dataset_out", {}).items():
        lines.append(f"  LOO {key}: {value}")
    return "\n".join(lines)


def main() -> None:
    try:
        sets = all_sets()
    except FileNotFoundError as exc:
        print(f"bench_recall_quality: {exc}; set MEMORY_BENCH_LOCOMO_DIR / MEMORY_BENCH_MADIAL_DIR", file=sys.stderr)
        sys.exit(2)
    load_services_env()
    settings = Settings.load()
    results: dict[str, Any] = {"sets": {d.name: d.about for d in sets}}
    results["default"] = run(sets, settings)
    print(table("default settings (offline model, no embeddings)", results["default"]), flush=True)
    results["with_embeddings"] = run(sets, settings, embeddings=True)
    print(table("with embeddings (e5-small, local)", results["with_embeddings"]), flush=True)
    write_results("bench_recall_quality", results)
    print(table("default settings (offline model, no embeddings)", results["default"]))
    print(table("with embeddings (e5-small, local)", results["with_embeddings"]))


if __name__ == "__main__":
    main()
