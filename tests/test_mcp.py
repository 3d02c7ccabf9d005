"""`memctl mcp` driven by the MCP SDK's own client: over stdio for one configured user, and over streamable
HTTP where each bearer token reaches only its own user's memory (no tool takes a user id, so a tool call
written by a prompt injection cannot name another user)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from api_stub.client import EpisodeReceipt, MemoryClient
from tests.factories import entities, record
from tests.ingest_helpers import graph_facts
from tests.servers import ServerProcess
from tests.services import ROOT
from tests.workers import WorkerProcess
from worker.graph.neo4j_store import Neo4jGraphStore

NewUser = Callable[[str], str]
TOOLS = {"remember", "recall", "forget_episode", "forget_me", "export"}


def run(session: Callable[[Any], Awaitable[None]], target: Any) -> None:
    """Run `session(client)` with an MCP SDK client connected to target (stdio parameters or an HTTP client)."""
    from mcp import Client

    async def main() -> None:
        async with Client(target) as client:
            await session(client)

    anyio.run(main)


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    return dict(result.structured_content)


def test_stdio_tools_remember_recall_export_and_forget_for_the_configured_user(
    workers: Callable[..., WorkerProcess],
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: NewUser,
    clean_redis: Any,
) -> None:
    from mcp import StdioServerParameters

    user, other = new_user("mcp-stdio"), new_user("mcp-other")
    store.save_episode(record(other, "user: my sister Anna lives in Lisbon"), entities("Anna"), [])
    workers()
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "api_stub.cli", "mcp", "--user", user], cwd=str(ROOT), env=dict(os.environ)
    )
    seen: dict[str, Any] = {}

    async def session(mcp: Any) -> None:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        assert set(tools) == TOOLS
        assert all("user_id" not in json.dumps(t.input_schema) for t in tools.values())
        said = [{"role": "user", "content": "My brother Tomas moved to Porto last spring."}]
        receipt = structured(await mcp.call_tool("remember", {"messages": said, "session_id": "chat-1"}))
        states = client.wait([EpisodeReceipt(**receipt)], timeout_s=60)
        assert [s.state for s in states] == ["persisted"]
        # An argument naming another user is not a parameter of the tool: it changes nothing.
        found = structured(await mcp.call_tool("recall", {"query": "Lisbon Anna Porto Tomas", "user_id": other}))
        assert {e["user_id"] for e in found["related_episodes"]} == {user}
        assert [e["id"] for e in found["related_episodes"]] == [receipt["episode_id"]]
        before = structured(await mcp.call_tool("recall", {"query": "Porto Tomas", "as_of": "2020-01-01T00:00:00Z"}))
        assert before["related_episodes"] == []  # as of a time before it was told
        exported = await mcp.call_tool("export", {})
        lines = [json.loads(x) for x in exported.content[0].text.splitlines()]
        assert lines[0]["user_id"] == user and [x["kind"] for x in lines].count("episode") == 1
        refused = await mcp.call_tool("forget_me", {"confirm": False})
        assert refused.is_error and "nothing erased" in refused.content[0].text
        bad = await mcp.call_tool("forget_episode", {"episode_id": "x" * 300})
        assert bad.is_error and "episode_id" in bad.content[0].text
        gone = structured(await mcp.call_tool("forget_episode", {"episode_id": receipt["episode_id"]}))
        seen["forgot"] = gone["episodes"]

    run(session, params)
    assert seen["forgot"] == 1
    assert graph_facts(store, user)["episodes"] == 0
    assert graph_facts(store, other)["episodes"] == 1


@pytest.fixture
def tokens(tmp_path: Path, new_user: NewUser) -> dict[str, str]:
    users = {"token-of-ana-0123456789": new_user("mcp-ana"), "token-of-bea-0123456789": new_user("mcp-bea")}
    (tmp_path / "tokens.json").write_text(json.dumps(users))
    return users


def test_http_each_token_reaches_only_its_users_memory_and_no_token_gets_401(
    tmp_path: Path, tokens: dict[str, str], store: Neo4jGraphStore
) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    ana_token, bea_token = list(tokens)
    ana, bea = tokens[ana_token], tokens[bea_token]
    store.save_episode(record(ana, "user: Ana keeps bees in Braga"), entities("Braga"), [])
    store.save_episode(record(bea, "user: Bea keeps bees in Braga too"), entities("Braga"), [])
    args = ("mcp", "--http", "--tokens-file", str(tmp_path / "tokens.json"))
    server = ServerProcess(tmp_path / "mcp.log", {}, *args, ready_path="/mcp").start()
    try:
        assert httpx.post(server.url + "/mcp", json={}, timeout=10).status_code == 401
        wrong = {"Authorization": "Bearer not-a-token-0123456789"}
        assert httpx.post(server.url + "/mcp", json={}, headers=wrong, timeout=10).status_code == 401
        for token, owner in tokens.items():
            answered: dict[str, Any] = {}

            async def session(mcp: Any, answered: dict[str, Any] = answered) -> None:
                answered.update(structured(await mcp.call_tool("recall", {"query": "bees Braga"})))

            async def connect(token: str = token) -> None:
                http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
                async with http:
                    from mcp import Client

                    async with Client(streamable_http_client(server.url + "/mcp", http_client=http)) as mcp:
                        await session(mcp)

            anyio.run(connect)
            assert {e["user_id"] for e in answered["related_episodes"]} == {owner}
        assert ana != bea
    finally:
        server.stop()


def test_http_refuses_to_start_without_a_way_to_know_the_user(tmp_path: Path) -> None:
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "MEMORY_HTTP_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "api_stub.cli", "mcp", "--http"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "--tokens-file" in done.stderr
    (tmp_path / "short.json").write_text(json.dumps({"short": "u"}))
    done = subprocess.run(
        [sys.executable, "-m", "api_stub.cli", "mcp", "--http", "--tokens-file", str(tmp_path / "short.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "16+ characters" in done.stderr
