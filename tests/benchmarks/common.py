"""Shared pieces of the benchmarks: timing, percentiles, JSON results, a deterministic synthetic corpus."""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.services import local_pid

RESULTS = Path(__file__).resolve().parent / "results"

_SYLLABLES = ["ka", "lo", "mi", "ren", "to", "sa", "vel", "qu", "dor", "in", "pa", "zu", "ber", "ni", "os", "tal"]


def percentile(samples: list[float], p: float) -> float:
    """Nearest-rank percentile of samples (p in 0..100)."""
    ordered = sorted(samples)
    index = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def latency_ms(samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    return {
        "p50_ms": round(percentile(ms, 50), 3),
        "p95_ms": round(percentile(ms, 95), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
        "n": len(ms),
    }


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def write_results(name: str, results: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": _cpus()},
        **results,
    }
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(payload, indent=2, ensure_ascii=False))
    print(f"written to {path}")
    return path


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


class Corpus:
    """Pseudo-words with a Zipf-like frequency, so BM25 sees common and rare terms as in real text."""

    def __init__(self, seed: int = 7, vocabulary: int = 5000, names: int = 3000) -> None:
        self.rng = random.Random(seed)
        self.words = self._unique(vocabulary, 2, 4)
        self.names = [w.capitalize() for w in self._unique(names, 2, 3, salt="n")]
        self.weights = [1 / (rank + 1) for rank in range(len(self.words))]

    def _unique(self, count: int, lo: int, hi: int, salt: str = "") -> list[str]:
        seen: set[str] = set()
        while len(seen) < count:
            seen.add(salt + "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.randint(lo, hi))))
        return sorted(seen)

    def sentence(self, rng: random.Random, n_words: int) -> str:
        return " ".join(rng.choices(self.words, self.weights, k=n_words))


Round = tuple[dict[str, float], dict[str, float]]  # (latencies of the measured call, of the floor)


def measure_rounds(
    items: list[Any], rounds: int, per_round: int, measure: Callable[[Any], tuple[float, float]]
) -> list[Round]:
    """Per round, `measure(item)` → (seconds of the call, seconds of the floor), interleaved item by item."""
    out = []
    for r in range(rounds):
        pairs = [measure(item) for item in items[r * per_round : (r + 1) * per_round]]
        out.append((latency_ms([a for a, _ in pairs]), latency_ms([b for _, b in pairs])))
    return out


def summarise_rounds(name: str, rounds: list[Round]) -> dict[str, Any]:
    """Medians over rounds of each p50/p95, the per-round p95s, and the p95 ratio to the floor."""
    p95 = statistics.median(a["p95_ms"] for a, _ in rounds)
    floor_p95 = statistics.median(b["p95_ms"] for _, b in rounds)
    return {
        "rounds": len(rounds),
        f"{name}_p50_ms_median": statistics.median(a["p50_ms"] for a, _ in rounds),
        f"{name}_p95_ms_median": p95,
        "floor_p50_ms_median": statistics.median(b["p50_ms"] for _, b in rounds),
        "floor_p95_ms_median": floor_p95,
        f"{name}_p95_ms_by_round": [a["p95_ms"] for a, _ in rounds],
        "floor_p95_ms_by_round": [b["p95_ms"] for _, b in rounds],
        "p95_ratio_to_floor": round(p95 / floor_p95, 2),
    }


def neo4j_cpu_s() -> float | None:
    """CPU seconds the local Neo4j (deploy/local/services.sh) has used; None when it is not ours to read."""
    pid = local_pid("neo4j/launcher.pid", "memory.Neo4jLauncher")
    if pid is None:
        return None
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
