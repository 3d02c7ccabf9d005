"""The demo: real Redis and Neo4j, a real worker, bundled conversations, then what was remembered.

    make demo      (installs, starts the local services, then runs this)
    .venv/bin/python deploy/demo/run_demo.py --fresh     (forget the demo users first, then run again)

With MEMORY_LLM_MODEL set to a litellm model (and its key in the environment) the worker uses that model;
by default it uses the offline extractor, so no network or key is needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONVERSATIONS = Path(__file__).with_name("conversations.jsonl")
DEMO_RECALL_BUDGET_MS = 10_000
QUESTIONS = {
    "alice": ["Where does my sister live?", "Who do I run with?", "Am I allergic to anything?"],
    "bob": ["What is my dog like?", "What did my boss ask me?"],
    "wang": ["北京冬天冷吗", "我在哪里工作", "去上海做什么"],
}


def load_env() -> None:
    env_file = ROOT / ".var" / "services.env"
    for line in env_file.read_text().splitlines() if env_file.exists() else []:
        name, sep, value = line.partition("=")
        if sep:
            os.environ.setdefault(name.strip(), value.strip())
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def main(argv: list[str]) -> int:
    fresh = "--fresh" in argv
    load_env()
    from api_stub import MemoryClient

    client = MemoryClient.from_env()
    items = [json.loads(line) for line in CONVERSATIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    if fresh:  # otherwise a second run finds every session already extracted ("unchanged")
        for user in sorted({i["user_id"] for i in items}):
            client.forget_user(user)
    log = ROOT / ".var" / "demo-worker.log"
    print(f"model: {client.settings.llm_model}   worker log: {log}")
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "api_stub.cli",
                "worker",
                *("--extract-concurrency", "4", "--persist-concurrency", "2"),
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        receipts = client.add_episodes(items)
        print(f"enqueued {len(receipts)} conversations from {len({i['user_id'] for i in items})} users")
        deadline = time.monotonic() + 180
        while True:
            states = client.wait(receipts, timeout_s=1)
            done = sum(s.state != "pending" for s in states)
            print(f"\r  processed {done}/{len(receipts)}", end="", flush=True)
            if done == len(receipts) or time.monotonic() > deadline:
                break
        print()
        for state in states:
            if state.state not in ("persisted", "unchanged"):  # unchanged: remembered by an earlier run
                print(f"  {state.episode_id}: {state.state}")
        for user, questions in QUESTIONS.items():
            print(f"\n== {user}")
            kept = client.remembered(user, limit=10)
            print("  remembered: " + ", ".join(f"{e.name} [{e.type}]" for e in kept.related_entities))
            for rel in kept.related_relations[:5]:
                print(f"    {rel.source} —{rel.description}→ {rel.target} (weight {rel.weight:g})")
            for question in questions:
                # A generous budget: the demo shows what is found, and its first queries warm a cold Neo4j.
                context = client.retrieve_memory(user, question, budget_ms=DEMO_RECALL_BUDGET_MS)
                print(f"  Q: {question}")
                if context.degraded:
                    print(f"    (degraded: {context.reason})")
                for hit in context.related_episodes[:2]:
                    print(f"    - {hit.summary}  (score {hit.score:.3f}, {', '.join(hit.matched_by)})")
                    if hit.passage:
                        print(f"      matched: {hit.passage}")
                if context.related_entities:
                    print("    entities: " + ", ".join(f"{e.name} [{e.type}]" for e in context.related_entities[:8]))
                for rel in context.related_relations[:4]:
                    print(f"    {rel.source} —{rel.description}→ {rel.target} (weight {rel.weight:g})")
        print("\nSee it working:")
        print("  Flower (tasks, workers):  MEMORY_FLOWER_USER=admin MEMORY_FLOWER_PASSWORD=... .venv/bin/memctl flower")
        print("                            then http://127.0.0.1:5555")
        print("  Metrics (Prometheus):     MEMORY_HTTP_TOKEN=$(openssl rand -hex 32) .venv/bin/memctl serve")
        print("                            then http://127.0.0.1:8080/metrics with that bearer token; API at /docs")
        print("  Ask yourself:             .venv/bin/memctl recall --user alice 'Where does my sister live?'")
        print("The demo's worker has stopped. Stop the local services with: make services-down")
        return 0 if all(s.state in ("persisted", "unchanged") for s in states) else 1
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        client.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
