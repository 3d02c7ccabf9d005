"""Where the tests, the demo and the benchmarks find the real local services, and how they stop/start them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    RedisClient = redis.Redis[bytes]
else:  # redis.Redis is generic only in its type stubs
    RedisClient = redis.Redis

ROOT = Path(__file__).resolve().parent.parent
SERVICES_SH = ROOT / "deploy" / "local" / "services.sh"
SERVICES_ENV = ROOT / ".var" / "services.env"


def load_services_env() -> None:
    """Copy .var/services.env into os.environ; variables already set in the environment win."""
    if not SERVICES_ENV.exists():
        return
    for line in SERVICES_ENV.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() and not line.lstrip().startswith("#"):
            os.environ.setdefault(name.strip(), value.strip())


def services(action: str, name: str) -> None:
    """Run deploy/local/services.sh ACTION NAME, failing loudly with its output."""
    done = subprocess.run(
        ["bash", str(SERVICES_SH), action, name], capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"services.sh {action} {name} failed ({done.returncode}): {done.stderr[-2000:]}")


def local_pid(pidfile: str, pattern: str) -> int | None:
    """The pid deploy/local/services.sh recorded under .var (`neo4j/launcher.pid`, `redis/redis.pid`), when that
    process still runs and its command line holds `pattern` (as the script's own `alive` checks); else None."""
    var = Path(os.environ.get("MEMORY_LOCAL_VAR", ROOT / ".var"))
    try:
        pid = int((var / pidfile).read_text().strip())
        if pattern.encode() not in (Path("/proc") / str(pid) / "cmdline").read_bytes():
            return None
    except (OSError, ValueError):
        return None
    return pid
