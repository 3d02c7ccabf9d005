"""What an episode costs in Redis at each point of its life, for English and for Chinese conversations: the
figures behind the README's capacity plan.

    make bench            (or: .venv/bin/python -m tests.benchmarks.bench_queue_bytes)

Runs on its own Redis database (MEMORY_REDIS_URL with /14), emptied before and after, on the local services'
Redis. Three moments, each measured by Redis itself (INFO used_memory before and after, and MEMORY USAGE per
key family): waiting for extraction (no worker), waiting for persistence (an extract-only worker ran), and
after persistence (task outcomes, session progress). English: LoCoMo's sessions (../shared/datasets, read
from there); Chinese: the Chinese conversations of tests/data/relevance.json, several to an episode so that
both languages have episodes of a few kilobytes.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from api_stub.client import MemoryClient
from tests.benchmarks.common import write_results
from tests.locomo import dataset_dir, load_conversations
from tests.relevance import load_dataset
from tests.services import RedisClient, load_services_env
from tests.workers import WorkerProcess, worker_env
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keys import EXTRACT_QUEUE, PERSIST_QUEUE
from worker.settings import Settings

EPISODES = 200
BENCH_DB = 14
Conversation = list[dict[str, str]]


def english() -> list[Conversation]:
    sessions = [s.messages for c in load_conversations(dataset_dir()) for s in c.sessions]
    return [sessions[i % len(sessions)] for i in range(EPISODES)]


def chinese() -> list[Conversation]:
    turns = [
        {"role": role, "content": text}
        for item in load_dataset().episodes
        for role, text in item["messages"]
        if any("\u4e00" <= ch <= "\u9fff" for ch in text)
    ]
    per_episode = 80  # ≈ 1,300 characters, ≈ 4 KB of UTF-8
    return [[turns[(i + j) % len(turns)] for j in range(per_episode)] for i in range(EPISODES)]


def families(r: RedisClient) -> dict[str, int]:
    """MEMORY USAGE summed by key family (the part of a key before its last ':' or the queue name)."""
    sizes: dict[str, int] = defaultdict(int)
    for key in r.scan_iter(count=1000):
        name = key.decode()
        family = name if name in (EXTRACT_QUEUE, PERSIST_QUEUE) else name.rsplit(":", 1)[0]
        if family.startswith("celery-task-meta-"):
            family = "celery-task-meta"
        sizes[family] += int(r.memory_usage(key, samples=0) or 0)
    return dict(sizes)


def used(r: RedisClient) -> int:
    return int(r.info("memory")["used_memory"])


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.5)


def measure(language: str, conversations: list[Conversation], url: str, store: Neo4jGraphStore) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    r.flushdb()
    settings = Settings.load().model_copy(update={"redis_url": url})
    client = MemoryClient(settings)
    user = f"bench-bytes-{language}-{uuid.uuid4().hex[:8]}"
    text_chars = sum(len(m["content"]) for c in conversations for m in c)
    text_bytes = sum(len(m["content"].encode("utf-8")) for c in conversations for m in c)
    logs = Path(tempfile.mkdtemp())
    # Extractions wait on the persist queue only when they are not written inline: measure that stage.
    env = worker_env(MEMORY_REDIS_URL=url, MEMORY_PERSIST_INLINE="false")
    stages: dict[str, Any] = {}
    try:
        base = used(r)
        receipts = [client.add_episode(user, f"s{i}", c) for i, c in enumerate(conversations)]
        stages["waiting_for_extraction"] = {"used_bytes": used(r) - base, "by_family": families(r)}
        extractor = WorkerProcess(logs / "extract.log", env, "--queues", EXTRACT_QUEUE).start()
        try:
            wait_until(lambda: r.llen(EXTRACT_QUEUE) == 0 and r.llen(PERSIST_QUEUE) == EPISODES, "extraction")
            time.sleep(1)  # the last acknowledgements
        finally:
            extractor.stop()
        stages["waiting_for_persistence"] = {"used_bytes": used(r) - base, "by_family": families(r)}
        persister = WorkerProcess(logs / "persist.log", env, "--queues", PERSIST_QUEUE).start()
        try:
            states = client.wait(receipts, timeout_s=600)
            if any(s.state != "persisted" for s in states):
                raise RuntimeError("not every episode was persisted")
        finally:
            persister.stop()
        stages["after_persistence"] = {"used_bytes": used(r) - base, "by_family": families(r)}
    finally:
        client.close()
        store.delete_user(user)
        r.flushdb()
    for stage in stages.values():
        stage["bytes_per_episode"] = round(stage["used_bytes"] / EPISODES)
        stage["bytes_per_text_byte"] = round(stage["used_bytes"] / text_bytes, 2)
        stage["bytes_per_character"] = round(stage["used_bytes"] / text_chars, 2)
    return {
        "episodes": EPISODES,
        "characters_per_episode": round(text_chars / EPISODES),
        "utf8_bytes_per_episode": round(text_bytes / EPISODES),
        **stages,
    }


def main() -> None:
    load_services_env()
    base_url = Settings.load().redis_url.rsplit("/", 1)
    url = f"{base_url[0]}/{BENCH_DB}" if base_url[1].isdigit() else f"{Settings.load().redis_url}/{BENCH_DB}"
    store = Neo4jGraphStore.from_settings(Settings.load())
    try:
        results = {
            "english_locomo": measure("en", english(), url, store),
            "chinese": measure("zh", chinese(), url, store),
            "how": "INFO used_memory deltas and MEMORY USAGE per key family, offline model, Redis db 14",
        }
    finally:
        store.close()
    write_results("bench_queue_bytes", results)


if __name__ == "__main__":
    main()
