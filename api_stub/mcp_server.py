"""`memctl mcp`: the memory service as an MCP server (the official `mcp` SDK), for agent tools.

Tools: remember (enqueue an episode), recall, forget_episode, forget_me, export. No tool takes a user id:
the user is the server's configuration (stdio: `--user`) or the bearer token's owner (streamable HTTP: each
token names its user), so a prompt-injected tool call cannot reach another user's memory.

stdio is the default (an MCP client starts `memctl mcp --user U`); `--http` serves streamable HTTP at /mcp,
where every request needs `Authorization: Bearer <token>` (401 otherwise) and the token file says whose it is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from api_stub.client import EpisodeReceipt, ForgetReport, MemoryClient
from api_stub.forget_part import ForgetPartReport
from worker.errors import MemoryServiceError, SettingsError
from worker.models import MemoryContext

log = logging.getLogger(__name__)

EXPORT_MAX_CHARS = 4_000_000  # a larger export is for `memctl export` (a tool result is held in memory)


class MessageIn(BaseModel):
    role: str = Field(description="user, assistant, system or tool")
    content: str


def load_tokens(path: Path) -> dict[str, str]:
    """A JSON object {token: user_id} (tokens of 16+ characters): who each bearer token is."""
    try:
        tokens = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SettingsError([f"--tokens-file {path}: {type(exc).__name__}"]) from None
    if not isinstance(tokens, dict) or not tokens:
        raise SettingsError([f"--tokens-file {path}: a JSON object of token → user id is required"])
    for token, user in tokens.items():
        if not isinstance(user, str) or not user or len(token) < 16:
            raise SettingsError([f"--tokens-file {path}: each token has 16+ characters and names a user id"])
    return tokens


def build_server(client: MemoryClient, *, user_id: str | None, tokens: dict[str, str] | None) -> Any:
    """user_id: the one user of a stdio server; tokens: token → user id for streamable HTTP."""
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.auth.provider import AccessToken, TokenVerifier
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    class Tokens(TokenVerifier):
        async def verify_token(self, token: str) -> AccessToken | None:
            user = (tokens or {}).get(token)
            return None if user is None else AccessToken(token=token, client_id=user, subject=user, scopes=["memory"])

    auth: dict[str, Any] = {}
    if tokens is not None:
        auth = {
            "token_verifier": Tokens(),
            "auth": AuthSettings(issuer_url="https://memory.invalid", resource_server_url=None),
        }
    server = MCPServer(
        "memory",
        instructions="Long-term memory of the user you talk with: recall before answering, remember after.",
        log_level="WARNING",
        **auth,
    )

    def user() -> str:
        if tokens is not None:  # HTTP: only the token says who asks
            token = get_access_token()
            if token is None or not token.subject:
                raise ToolError("no user: the request carried no valid token")
            return str(token.subject)
        if user_id is None:
            raise ToolError("no user: this server has none configured")
        return user_id

    def call(work: Callable[[], Any]) -> Any:
        try:
            return work()
        except MemoryServiceError as exc:
            raise ToolError(str(exc)) from None

    @server.tool()
    def remember(
        messages: list[MessageIn],
        session_id: Annotated[str, Field(description="The conversation these messages belong to.")] = "mcp",
        occurred_at: datetime | None = None,
    ) -> EpisodeReceipt:
        """Remember a conversation (or its latest part) of the user: queued at once, extracted by workers."""
        sent = [m.model_dump() for m in messages]
        return call(lambda: client.add_episode(user(), session_id, sent, occurred_at=occurred_at))  # type: ignore[no-any-return]

    @server.tool()
    def recall(
        query: Annotated[str, Field(description="What to look for in the user's memory.")],
        limit: Annotated[int, Field(ge=1, le=100)] = 10,
        as_of: Annotated[datetime | None, Field(description="Answer as of this time (timezone-aware).")] = None,
    ) -> MemoryContext:
        """What the user told you before that is relevant to the query: episodes, entities, relations (current
        facts first; ended ones marked, with when they ended)."""
        return call(lambda: client.retrieve_memory(user(), query, limit=limit, as_of=as_of))  # type: ignore[no-any-return]

    @server.tool()
    def forget_episode(episode_id: str) -> ForgetPartReport:
        """Forget one remembered episode of the user (its id comes from recall or remember)."""
        return call(lambda: client.forget_episode(user(), episode_id))  # type: ignore[no-any-return]

    @server.tool()
    def forget_me(
        confirm: Annotated[bool, Field(description="true only when the user asked to erase all their memory")],
    ) -> ForgetReport:
        """Erase everything remembered about the user. Only when the user asks for it."""
        if not confirm:
            raise ToolError("nothing erased: confirm must be true, and only when the user asked for it")
        return call(lambda: client.forget_user(user()))  # type: ignore[no-any-return]

    @server.tool()
    def export() -> str:
        """Everything remembered about the user, as JSON Lines (format: header, episodes, entities,
        relationships, sessions, end)."""

        def read() -> str:
            text, size = [], 0
            for line in client.export_user(user()):
                size += len(line)
                if size > EXPORT_MAX_CHARS:
                    raise ToolError("the export is larger than a tool result should be: use `memctl export`")
                text.append(line)
            return "".join(text)

        return call(read)  # type: ignore[no-any-return]

    return server
