"""`memctl worker` on stop: every child gets SIGTERM at once and one shared grace period, then is killed."""

from __future__ import annotations

import os
import signal
import threading
import time

from worker.supervisor import Child, supervise


class Stubborn(Child):
    """A child that ignores SIGTERM, as a worker in the middle of a long LLM call would for a while."""

    def command(self) -> list[str]:
        return ["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"]


def test_children_share_one_grace_period_then_are_killed() -> None:
    children: list[Child] = [Stubborn("memory.extract", 1, "INFO"), Stubborn("memory.persist", 1, "INFO")]
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stopper = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        stopper.start()
        started = time.monotonic()
        assert supervise(children, grace_s=3.0) == 0
        stopped_after = time.monotonic() - started - 1.0
    finally:
        stopper.cancel()
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    for child in children:
        assert child.process is not None and child.process.returncode == -signal.SIGKILL
    # One grace for both (each waited in turn with its own would take twice as long).
    assert 3.0 <= stopped_after < 5.5, stopped_after
