"""`memctl mcp`: serve the memory tools to MCP clients (api_stub/mcp_server.py)."""

from __future__ import annotations

from pathlib import Path

import click

from api_stub.cli_common import settings_or_exit
from worker.errors import MemoryServiceError


@click.command()
@click.option("--user", "user_id", default=None, help="The user whose memory this server serves.")
@click.option("--http", "http", is_flag=True, help="Streamable HTTP at /mcp instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8765, show_default=True)
@click.option(
    "--tokens-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="HTTP: a JSON object {bearer token: user id}; each token reaches only its user's memory.",
)
def mcp(user_id: str | None, http: bool, host: str, port: int, tokens_file: Path | None) -> None:
    """Serve remember, recall, forget_episode, forget_me and export as MCP tools. stdio (default) needs
    --user; --http needs --tokens-file (a token of its own per user: never the HTTP facade's token, which
    reaches every user)."""
    from api_stub.client import MemoryClient
    from api_stub.mcp_server import build_server, load_tokens
    from api_stub.recall import check_user_id
    from worker.log_fields import log_to_stderr

    settings = settings_or_exit()
    try:
        user = check_user_id(user_id) if user_id is not None else None
        tokens: dict[str, str] | None = None
        if http:
            if tokens_file is None:
                raise click.UsageError("--http needs --tokens-file (each bearer token names its user)")
            if user is not None:
                raise click.UsageError("--http takes its users from --tokens-file, not --user")
            tokens = load_tokens(tokens_file)
        elif user is None:
            raise click.UsageError("stdio needs --user (the user whose memory this server serves)")
    except MemoryServiceError as exc:
        raise click.ClickException(str(exc)) from None
    log_to_stderr()  # stdio: stdout is the protocol's; the audit records go to stderr
    client = MemoryClient(settings)
    try:
        server = build_server(client, user_id=user, tokens=tokens)
        if http:
            server.run("streamable-http", host=host, port=port)
        else:
            server.run()
    finally:
        client.close()
