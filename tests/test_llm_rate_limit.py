"""The LLM rate limit is shared by processes: two processes calling at once stay within one bucket."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import redis

from tests.llm_standin import StandIn, answer
from tests.services import ROOT
from worker.keys import LLM_RATE_LIMIT
from worker.settings import Settings


def test_rate_limit_holds_across_two_processes(standin: StandIn, settings: Settings) -> None:
    standin.default = lambda _request: answer({})
    redis.Redis.from_url(settings.redis_url).delete(LLM_RATE_LIMIT)
    env = {
        **os.environ,
        "MEMORY_LLM_MODEL": "openai/stand-in",
        "MEMORY_LLM_API_BASE": standin.url,
        "MEMORY_LLM_API_KEY": "sk-stand-in",
        "MEMORY_LLM_REQUESTS_PER_MINUTE": "120",  # 2 per second, bursts of 2
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    start_at = time.time() + 25
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.ratelimit_client", "6", str(start_at)], env=env, cwd=ROOT)
        for _ in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]

    times = sorted(r["_at"] for r in standin.requests)
    assert len(times) == 12
    assert min(times) >= start_at - 0.05  # both processes waited for the common start line
    # A token bucket of rate 2/s and capacity 2 grants at most 2 + 2 calls in any one-second window, so 12
    # calls need at least (12 - 2) / 2 = 5 s (unlimited, they take a fraction of a second). Times are taken
    # at the server, where a process's first call arrives late (connection set-up): one call of slack.
    assert max(sum(1 for u in times if t <= u < t + 1.0) for t in times) <= 5
    assert times[-1] - times[0] >= 4.0
