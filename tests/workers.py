"""Real `memctl worker` processes for tests: started in their own process group, killed or stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from api_stub.cli import DEFAULT_EXTRACT_PROCESSES
from tests.services import ROOT

# Small timings so redelivery and retries happen in seconds; the settings still check visibility > cap + limit.
TEST_WORKER_ENV = {
    "MEMORY_VISIBILITY_TIMEOUT_S": "15",
    "MEMORY_UNACKED_RESTORE_INTERVAL_S": "1",
    "MEMORY_UNACKED_RESTORE_THROTTLE": "1",
    "MEMORY_TASK_TIME_LIMIT_S": "10",
    "MEMORY_RETRY_BACKOFF_BASE_S": "0.5",
    "MEMORY_RETRY_BACKOFF_CAP_S": "2",
    "MEMORY_RETRY_MAX_ATTEMPTS": "20",
    "MEMORY_MAX_DELIVERIES": "3",
    "MEMORY_SWEEP_INTERVAL_S": "5",
    "MEMORY_SWEEP_GRACE_S": "5",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}


def worker_env(**overrides: str) -> dict[str, str]:
    return {**os.environ, **TEST_WORKER_ENV, **overrides}


class WorkerProcess:
    def __init__(self, log_path: Path, env: dict[str, str], *args: str, defaults: bool = False) -> None:
        """args: `memctl worker` options. One extract process unless --extract-processes is given or
        `defaults` (the default, two, only costs the tests start-up time; benchmarks run the defaults)."""
        self.log_path = log_path
        self.env = env
        one = defaults or "--extract-processes" in args
        self.args = args if one else (*args, "--extract-processes", "1")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> WorkerProcess:
        # one `ready.` line per Celery worker: one per queue, and --extract-processes of the extract queue
        extract = (
            int(self.args[self.args.index("--extract-processes") + 1])
            if "--extract-processes" in self.args
            else DEFAULT_EXTRACT_PROCESSES
        )
        queues = 1 if "--queues" in self.args else 1 + extract
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "api_stub.cli", "worker", "--loglevel", "INFO", *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = time.monotonic()
        before = self._ready_lines()
        while self._ready_lines() < before + queues:
            if self.process.poll() is not None or time.monotonic() - started > timeout_s:
                raise RuntimeError(f"worker did not start; log:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        return self

    def _ready_lines(self) -> int:
        return self.log_path.read_text(errors="replace").count(" ready.") if self.log_path.exists() else 0

    def kill(self) -> None:
        """SIGKILL the whole process group: supervisor and Celery workers die at once, nothing is acked."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
            wait_group_dead(self.process.pid)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
            wait_group_dead(self.process.pid)


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and (fields[0] != "Z" or _holds_files(entry)):
            alive.append(int(entry.name))
    return alive


def _holds_files(proc: Path) -> bool:
    """A multi-threaded process shows Z as soon as its main thread exits, while its other threads still
    run and keep its sockets open; it is gone only when no thread of it is left running."""
    try:
        tasks = list((proc / "task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                return True
        except OSError:
            continue
    return False


def wait_group_dead(pgid: int, timeout_s: float = 30) -> None:
    """Until every process of the group has exited (its sockets closed), so no dead worker's BRPOP lingers."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def celery_pids(queue: str) -> list[int]:
    """Pids of running Celery workers consuming `queue` (started by memctl worker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"celery" in b" ".join(cmdline) and queue.encode() in cmdline and b"-Q" in cmdline:
            pids.append(int(entry.name))
    return pids
