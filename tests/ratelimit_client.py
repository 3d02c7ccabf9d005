"""Helper process for the rate-limit test: N LLM calls through the shared Redis token bucket.

python -m tests.ratelimit_client CALLS START_AT_EPOCH   (settings from MEMORY_* variables)
"""

from __future__ import annotations

import sys
import time

from worker.llm.client import build_client, litellm_module
from worker.settings import Settings


def main() -> None:
    calls, start_at = int(sys.argv[1]), float(sys.argv[2])
    client = build_client(Settings.load())
    litellm_module()  # import before the start line, so both processes really call at the same time
    time.sleep(max(0.0, start_at - time.time()))
    for _ in range(calls):
        client.complete(lambda _: [{"role": "user", "content": "ping"}], Settings)


if __name__ == "__main__":
    main()
