"""Export and import of a user's memory: speed, and memory that does not grow with the user's history.

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_portability)

Issue 13 asks for an export in constant memory in the size of the user's history. Three users of SMALL,
LARGE and LARGER episodes (bench_store's synthetic episodes: 5 entities, 5 relationships each); for each, the Python
heap's peak while the export is read to the end (tracemalloc, a pass of its own), the export's lines/s, and
the import's episodes/s into the same deployment after the user is erased (then a second, no-op import).
Data: users `bench-port-*`, erased at the start and at the end of every run.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from api_stub.export_lines import export_lines
from api_stub.portability import import_file
from tests.benchmarks.bench_store import episode
from tests.benchmarks.common import Corpus, write_results
from tests.services import load_services_env
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.settings import Settings

SMALL, LARGE, LARGER = 500, 20_000, 40_000


def load(store: Neo4jGraphStore, corpus: Corpus, user: int, n: int) -> str:
    now = time.time()  # accepted after the erasure that cleared the user
    writes = [
        (r.model_copy(update={"accepted_at": now}), e, x)
        for r, e, x in (episode(corpus, user, i, "port") for i in range(n))
    ]
    for start in range(0, n, 200):
        store.save_episodes(writes[start : start + 200])
    return writes[0][0].user_id


def erase(store: Neo4jGraphStore, user_id: str) -> None:
    store.mark_erased(user_id, time.time(), erasing_for_s=0.0)
    store.delete_user(user_id)


def peak_export_bytes(store: Neo4jGraphStore, user_id: str) -> tuple[int, int]:
    """(peak traced bytes while exporting, lines)."""
    tracemalloc.start()
    lines = sum(1 for _ in export_lines(store, user_id))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, lines


def run_one(store: Neo4jGraphStore, corpus: Corpus, user: int, n: int, folder: Path) -> dict[str, Any]:
    user_id = f"bench-u{user:04d}"
    erase(store, user_id)
    load(store, corpus, user, n)
    peak, lines = peak_export_bytes(store, user_id)
    path = folder / f"{user_id}.jsonl"
    started = time.perf_counter()
    with path.open("w", encoding="utf-8") as out:
        out.writelines(export_lines(store, user_id))
    export_s = time.perf_counter() - started
    erase(store, user_id)
    started = time.perf_counter()
    report = import_file(store, path)
    import_s = time.perf_counter() - started
    started = time.perf_counter()
    again = import_file(store, path)
    again_s = time.perf_counter() - started
    assert report.episodes_created == n and again.episodes_present == n, (report, again)
    erase(store, user_id)
    return {
        "episodes": n,
        "lines": lines,
        "file_mb": round(path.stat().st_size / 1e6, 2),
        "export_peak_python_heap_mb": round(peak / 1e6, 2),
        "export_lines_per_s": round(lines / export_s, 1),
        "import_episodes_per_s": round(n / import_s, 1),
        "second_import_episodes_per_s": round(n / again_s, 1),
    }


def main() -> None:
    load_services_env()
    store = Neo4jGraphStore.from_settings(Settings.load())
    store.ensure_schema()
    corpus = Corpus()
    try:
        with TemporaryDirectory() as folder:
            small = run_one(store, corpus, 9001, SMALL, Path(folder))
            large = run_one(store, corpus, 9002, LARGE, Path(folder))
            larger = run_one(store, corpus, 9003, LARGER, Path(folder))
    finally:
        store.close()
    ratio = larger["export_peak_python_heap_mb"] / max(large["export_peak_python_heap_mb"], 1e-9)
    write_results(
        "bench_portability",
        {
            "small": small,
            "large": large,
            "larger": larger,
            "export_peak_ratio_larger_to_large": round(ratio, 2),
            "history_ratio_larger_to_large": LARGER / LARGE,
            "goal": "export memory bounded: the peak stops growing while the history doubles",
        },
    )


if __name__ == "__main__":
    main()
