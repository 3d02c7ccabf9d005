"""`make demo` without the install step: the demo's main path against the real services, as a newcomer runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.llm_standin import StandIn, answer
from tests.services import ROOT
from tests.workers import celery_pids
from worker.keys import EXTRACT_QUEUE


def run_demo(**env: str) -> str:
    done = subprocess.run(
        [sys.executable, "deploy/demo/run_demo.py", "--fresh"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def test_demo_uses_the_model_named_in_the_environment(standin: StandIn) -> None:
    reply = {
        "summary": "stand-in summary",
        "entities": [{"name": "Standin", "type": "other", "description": "the stand-in"}],
        "relationships": [],
    }
    standin.default = lambda request: answer(reply)
    out = run_demo(MEMORY_LLM_MODEL="openai/stand-in", MEMORY_LLM_API_BASE=standin.url, MEMORY_LLM_API_KEY="sk-x")
    assert "model: openai/stand-in" in out and "processed 9/9" in out
    assert standin.calls >= 9 and all(r["model"] == "stand-in" for r in standin.requests)
    assert "Standin [other]" in out


def test_demo_remembers_and_recalls_the_bundled_conversations() -> None:
    out = run_demo(MEMORY_LLM_MODEL="offline")
    assert "model: offline" in out
    assert "enqueued 9 conversations from 3 users" in out
    assert "processed 9/9" in out
    for user in ("alice", "bob", "wang"):
        assert f"== {user}" in out
    alice = out.split("== alice")[1].split("== bob")[0]
    assert "remembered: " in alice and "Anna" in alice and "Lisbon" in alice
    assert "—" in alice  # a relationship line: source —description→ target
    sister = alice.split("Q: Where does my sister live?")[1].split("Q:")[0]
    assert "Lisbon" in sister  # the answering episode comes first
    peanuts = alice.split("Q: Am I allergic to anything?")[1].split("Q:")[0]
    assert "peanuts" in peanuts.split("\n")[1]
    assert "matched: " in peanuts  # the passage that matched is shown under the summary
    wang = out.split("== wang")[1]
    assert "北京" in wang.split("Q: 北京冬天冷吗")[1].split("Q:")[0]
    assert "memctl flower" in out and "/metrics" in out and "make services-down" in out
    assert not celery_pids(EXTRACT_QUEUE), "the demo left its worker running"
