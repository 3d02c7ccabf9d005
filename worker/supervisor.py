"""`memctl worker`: one Celery worker per queue, each with the pool that fits its work, restarted if it dies.

Extraction waits on the LLM (I/O): a thread pool with high concurrency. Persistence waits on Neo4j: a small
thread pool (the Neo4j driver is thread-safe and pools connections). A worker process that dies (killed,
out of memory, a poison message) is started again after a short pause, as a process manager would.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

RESTART_PAUSE_S = 1.0


@dataclass
class Child:
    queue: str
    concurrency: int
    loglevel: str
    index: int = 0  # several workers on one queue: each its own node name (Flower, liveness)
    process: subprocess.Popen[bytes] | None = None
    restarts: int = field(default=0)

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.celery_app",
            "worker",
            "-Q",
            self.queue,
            "-P",
            "threads",
            "-c",
            str(self.concurrency),
            "-n",
            f"{self.queue}@%h" if not self.index else f"{self.queue}-{self.index}@%h",
            "-E",
            "--without-gossip",
            "--without-mingle",
            "-l",
            self.loglevel,
        ]

    def start(self) -> None:
        self.process = subprocess.Popen(self.command())


def supervise(
    children: list[Child],
    sweep: Callable[[], int] | None = None,
    sweep_interval_s: float = 60,
    grace_s: float = 150,
) -> int:
    """Run the children until SIGTERM/SIGINT; every sweep_interval_s, re-enqueue episodes gone silent. On
    stop, every child gets SIGTERM at once (warm shutdown) and one shared grace period to finish; those
    still running at its end are killed (their unacknowledged messages go back to the queue)."""
    stopping = False
    next_sweep = time.monotonic() + sweep_interval_s

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for child in children:
        child.start()
    while not stopping:
        time.sleep(0.2)
        if sweep is not None and time.monotonic() >= next_sweep:
            next_sweep = time.monotonic() + sweep_interval_s
            try:
                found = sweep()
                if found:
                    print(f"memctl worker: re-enqueued {found} silent episode(s)", file=sys.stderr, flush=True)
            except Exception as exc:  # Redis away: the next round tries again
                print(f"memctl worker: sweep failed ({type(exc).__name__})", file=sys.stderr, flush=True)
        for child in children:
            if child.process is not None and child.process.poll() is not None and not stopping:
                print(
                    f"memctl worker: {child.queue} worker exited ({child.process.returncode}); restarting",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(RESTART_PAUSE_S)
                child.restarts += 1
                child.start()
    for child in children:  # warm shutdown: running tasks finish, unstarted ones stay in Redis
        if child.process is not None and child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        if child.process is not None:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
    return 0
