"""`make demo` without the install step: the demo's main path against the real services, as a newcomer runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.services import ROOT
from tests.workers import celery_pids
from worker.keys import EXTRACT_QUEUE


def test_demo_remembers_and_recalls_the_bundled_conversations() -> None:
    env = {**os.environ, "MEMORY_LLM_MODEL": "offline"}
    done = subprocess.run(
        [sys.executable, "deploy/demo/run_demo.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "model: offline" in out
    assert "enqueued 6 conversations from 3 users" in out
    assert "processed 6/6" in out
    for user in ("alice", "bob", "wang"):
        assert f"== {user}" in out
    alice = out.split("== alice")[1].split("== bob")[0]
    assert "remembered: " in alice and "Anna" in alice and "Lisbon" in alice
    assert "—" in alice  # a relationship line: source —description→ target
    sister = alice.split("Q: Where does my sister live?")[1].split("Q:")[0]
    assert "Lisbon" in sister  # the answering episode comes first
    wang = out.split("== wang")[1]
    assert "北京" in wang.split("Q: 北京冬天冷吗")[1].split("Q:")[0]
    assert "memctl flower" in out and "/metrics" in out and "make services-down" in out
    assert not celery_pids(EXTRACT_QUEUE), "the demo left its worker running"
