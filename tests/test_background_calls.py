"""Closing a pool of background calls (recalls, keyword and embedding calls) waits, within a bound, for the
calls already running: whatever they hold (a Neo4j connection in the middle of a query) is released before
the caller closes it. A pending call that never started is cancelled; a call stuck past the bound is left."""

from __future__ import annotations

import threading
import time

from worker.background import BackgroundCalls


def test_close_waits_for_running_calls_within_its_bound_and_cancels_the_rest() -> None:
    calls: BackgroundCalls[str] = BackgroundCalls("t", workers=1, max_pending=2)
    finished = threading.Event()
    started = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.4)
        finished.set()
        return "done"

    running = calls.submit("a", slow)
    queued = calls.submit("b", lambda: "never")
    assert running is not None and queued is not None
    assert started.wait(5)
    calls.close(wait_s=5.0)
    assert finished.is_set()  # close returned only after the running call ended
    assert queued.cancelled()
    assert calls.submit("c", lambda: "late") is None  # closed: nothing new starts


def test_close_gives_up_on_a_stuck_call_after_its_bound() -> None:
    calls: BackgroundCalls[None] = BackgroundCalls("t", workers=1, max_pending=1)
    release = threading.Event()

    def stuck() -> None:
        release.wait(10)

    assert calls.submit("stuck", stuck) is not None
    begun = time.monotonic()
    calls.close(wait_s=0.3)
    took = time.monotonic() - begun
    release.set()
    assert 0.25 <= took < 5, took
