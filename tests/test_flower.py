"""`memctl flower`: refuses to start without credentials, and with them asks every visitor for basic auth."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.servers import ServerProcess, free_port, run_cli


def test_flower_refuses_to_start_without_credentials() -> None:
    refused = run_cli(
        "flower", "--port", str(free_port()), env={"MEMORY_FLOWER_USER": "", "MEMORY_FLOWER_PASSWORD": ""}
    )
    assert refused.returncode != 0
    assert "MEMORY_FLOWER_USER" in refused.stderr and "--insecure-no-auth" in refused.stderr


def test_flower_requires_basic_auth(tmp_path: Path) -> None:
    env = {"MEMORY_FLOWER_USER": "ops", "MEMORY_FLOWER_PASSWORD": "s3cret-flower-pw"}
    flower = ServerProcess(tmp_path / "flower.log", env, "flower").start()
    try:
        assert httpx.get(flower.url + "/", timeout=10).status_code == 401
        assert httpx.get(flower.url + "/", auth=("ops", "wrong"), timeout=10).status_code == 401
        page = httpx.get(flower.url + "/workers", auth=("ops", "s3cret-flower-pw"), timeout=10)
        assert page.status_code == 200 and "Flower" in page.text
        assert "s3cret-flower-pw" not in " ".join(_cmdline(flower))  # in the environment, not in `ps`
    finally:
        flower.stop()


def test_flower_without_auth_only_when_asked_explicitly(tmp_path: Path) -> None:
    env = {"MEMORY_FLOWER_USER": "", "MEMORY_FLOWER_PASSWORD": ""}
    flower = ServerProcess(tmp_path / "flower.log", env, "flower", "--insecure-no-auth").start()
    try:
        assert httpx.get(flower.url + "/workers", timeout=10).status_code == 200
    finally:
        flower.stop()


def _cmdline(server: ServerProcess) -> list[str]:
    assert server.process is not None
    return Path(f"/proc/{server.process.pid}/cmdline").read_bytes().decode().split("\0")
