"""memctl: run workers, import conversations, operate the dead-letter store, check health.

Exit codes: 0 ok, 1 failure or unhealthy, 2 usage error.
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from api_stub.cli_common import memory_client
from api_stub.cli_common import redis_for as _redis
from api_stub.cli_common import settings_or_exit as _settings
from api_stub.cli_dlq import dlq
from api_stub.cli_mcp import mcp
from api_stub.cli_memory import export, import_memory, reextract
from worker.errors import EpisodeRejected, MemoryServiceError, QueueFull, broker_errors
from worker.keys import EXTRACT_QUEUE, PERSIST_QUEUE
from worker.settings import Settings

DEFAULT_EXTRACT_PROCESSES = 2  # one Python process uses one core: two keep this 2-core reference machine busy
DEFAULT_EXTRACT_THREADS = 64  # LLM calls (and their inline writes) in flight per process
DEFAULT_PERSIST_THREADS = 32  # threads that only wait for their batch's commit
QUEUE_FULL_WAIT_S = 600.0  # memctl import waits this long for a full queue to drain before it gives up


class _Commands(click.Group):
    """A Redis that cannot take a command is a command's clear failure, not a traceback (each command can be
    run again once it is back: its steps are idempotent)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except broker_errors() as exc:
            raise click.ClickException(
                f"Redis is unreachable ({type(exc).__name__}): run the command again once it is back"
            ) from None


@click.group(cls=_Commands)
def main() -> None:
    """Operate the memory service."""


main.add_command(dlq)
main.add_command(export)
main.add_command(import_memory)
main.add_command(reextract)
main.add_command(mcp)


@main.command()
@click.option(
    "--extract-concurrency",
    default=DEFAULT_EXTRACT_THREADS,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Threads per extract process: LLM calls (and, inline, their writes) in flight at once.",
)
@click.option(
    "--extract-processes",
    default=DEFAULT_EXTRACT_PROCESSES,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Extract worker processes, each with --extract-concurrency threads (one Python process uses one core).",
)
@click.option(
    "--persist-concurrency",
    default=DEFAULT_PERSIST_THREADS,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Persist threads; those waiting together share one Neo4j transaction (MEMORY_PERSIST_BATCH).",
)
@click.option("--queues", default=f"{EXTRACT_QUEUE},{PERSIST_QUEUE}", show_default=True)
@click.option(
    "--loglevel",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
)
def worker(
    extract_concurrency: int, extract_processes: int, persist_concurrency: int, queues: str, loglevel: str
) -> None:
    """Start workers for the extract and persist queues (and restart them if they die)."""
    from worker.supervisor import Child, supervise

    settings = _settings()  # refuse to start on invalid settings
    wanted = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = set(wanted) - {EXTRACT_QUEUE, PERSIST_QUEUE}
    if unknown or not wanted:
        raise click.UsageError(f"unknown queue(s): {', '.join(sorted(unknown)) or '(none)'}")
    concurrency = {EXTRACT_QUEUE: extract_concurrency, PERSIST_QUEUE: persist_concurrency}
    from api_stub.client import MemoryClient

    client = MemoryClient(settings)

    redis = _redis(settings)

    def sweep() -> int:
        return _sweep(client, redis, settings, settings.silent_episode_s)

    processes = {EXTRACT_QUEUE: extract_processes, PERSIST_QUEUE: 1}
    children = [Child(q, concurrency[q], loglevel, index=i) for q in wanted for i in range(processes[q])]
    sys.exit(supervise(children, sweep, settings.sweep_interval_s, settings.shutdown_grace_s))


@main.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--wait", "wait_s", type=float, default=None, help="Wait up to this many seconds for the outcome.")
def import_(file: Path, wait_s: float | None) -> None:
    """Enqueue conversations from a JSONL file: one {"user_id", "session_id", "messages"} per line."""
    from api_stub.client import MemoryClient

    client = MemoryClient(_settings())
    items = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise click.ClickException(f"{file}:{number}: not JSON ({exc.msg})") from None
        try:
            if not isinstance(item, dict):
                raise EpisodeRejected("not a JSON object")
            if not isinstance(item.get("messages", []), list):
                raise EpisodeRejected("must be a list of messages", "messages")
            client.validate(item.get("user_id", ""), item.get("session_id", ""), item.get("messages", []))
        except EpisodeRejected as exc:
            raise click.ClickException(f"{file}: line {number}: {exc}; nothing was enqueued") from None
        items.append(item)
    receipts = []
    with click.progressbar(items, label="enqueue", file=sys.stderr) as bar:
        for number, item in enumerate(bar, start=1):
            waited_until = time.monotonic() + QUEUE_FULL_WAIT_S
            while True:
                try:
                    receipts.append(client.add_episode(item["user_id"], item["session_id"], item["messages"]))
                    break
                except QueueFull:  # backpressure: wait for the workers to catch up, then go on
                    if time.monotonic() > waited_until:
                        raise click.ClickException(
                            f"{file}: the queue stayed full for {QUEUE_FULL_WAIT_S:g} s; the first {number - 1} "
                            f"conversations were enqueued, resume from conversation {number}"
                        ) from None
                    time.sleep(1.0)
    click.echo(f"enqueued {len(receipts)} episodes")
    if wait_s is not None:
        states = client.wait(receipts, timeout_s=wait_s)
        counts: dict[str, int] = {}
        for state in states:
            counts[state.state] = counts.get(state.state, 0) + 1
        click.echo(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        if counts.get("pending") or counts.get("dead_lettered") or counts.get("conflict"):
            sys.exit(1)


@main.command()
@click.option("--silent-for", "silent_for_s", type=float, default=None, help="Seconds (default from settings).")
def sweep(silent_for_s: float | None) -> None:
    """Give back what lost workers held and re-enqueue accepted episodes that went silent (a message lost by
    the broker). `memctl worker` runs this every MEMORY_SWEEP_INTERVAL_S."""
    from api_stub.client import MemoryClient

    settings = _settings()
    client = MemoryClient(settings)
    found = _sweep(client, _redis(settings), settings, silent_for_s or settings.silent_episode_s)
    click.echo(f"re-enqueued {found}")


def _sweep(client: Any, redis: Any, settings: Settings, silent_for_s: float) -> int:
    """First the messages lost workers held (back to their queues, broker busy or not), then, with the
    broker idle, accepted episodes that no message carries any more."""
    from worker.liveness import kombu_restore, restore_orphans

    restored = restore_orphans(redis, kombu_restore(client._celery()), settings.worker_dead_after_s)
    return restored + int(client._in_flight().sweep(silent_for_s, client.recover))


@main.command()
@click.option("--user", "user_id", required=True)
@click.argument("query")
@click.option("--limit", type=int, default=None)
@click.option("--as-of", "as_of", default=None, help="Answer as of this time (ISO 8601; a date or no zone: UTC).")
@click.option("--json", "as_json", is_flag=True)
def recall(user_id: str, query: str, limit: int | None, as_of: str | None, as_json: bool) -> None:
    """What the memory returns for a user's query (the same call an agent engine makes)."""
    from api_stub.client import MemoryClient

    when = _as_of(as_of)
    client = MemoryClient(_settings())
    try:
        context = client.retrieve_memory(user_id, query, limit=limit, as_of=when)
    except MemoryServiceError as exc:
        raise click.UsageError(str(exc)) from None
    finally:
        client.close()
    if as_json:
        click.echo(context.model_dump_json(indent=2))
    else:
        if context.degraded:
            click.echo(f"degraded: {context.reason}")
        for hit in context.related_episodes:
            click.echo(f"{hit.score:.4f}  {hit.id}  [{', '.join(hit.matched_by)}]  {hit.summary}")
            if hit.passage:
                click.echo(f"        matched: {hit.passage}")
        if context.related_entities:
            click.echo("entities: " + ", ".join(f"{e.name} ({e.type})" for e in context.related_entities))
        for rel in context.related_relations:
            ended = "" if rel.current else f"  (ended {rel.invalid_from:%Y-%m-%d})" if rel.invalid_from else ""
            since = f" since {rel.valid_from:%Y-%m-%d}" if rel.valid_from else ""
            click.echo(f"  {rel.source} -[{rel.predicate} {rel.weight:g}]-> {rel.target}{since}{ended}")
    sys.exit(1 if context.degraded else 0)


def _as_of(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO 8601 date or time", param_hint="--as-of") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


@main.command()
@click.option("--user", "user_id", required=True)
@click.option("--episode", "episode_id", default=None, help="Forget only this episode.")
@click.option("--session", "session_id", default=None, help="Forget only this session's episodes.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def forget(user_id: str, episode_id: str | None, session_id: str | None, yes: bool) -> None:
    """Erase everything kept about a user (graph, dead letters, cached keywords), or one episode or session."""
    if episode_id is not None and session_id is not None:
        raise click.UsageError("give --episode or --session, not both")
    what = (
        f"episode {episode_id!r} of user {user_id!r}"
        if episode_id is not None
        else f"session {session_id!r} of user {user_id!r}"
        if session_id is not None
        else f"all memory of user {user_id!r}"
    )
    if not yes and not click.confirm(f"erase {what}?"):
        sys.exit(1)
    with memory_client() as client:
        if episode_id is not None:
            report: Any = client.forget_episode(user_id, episode_id)
        elif session_id is not None:
            report = client.forget_session(user_id, session_id)
        else:
            report = client.forget_user(user_id)
    click.echo(report.model_dump_json())


@main.command()
def reindex() -> None:
    """Give episodes stored by an earlier version their search terms and windows (after an upgrade)."""
    from worker.graph.neo4j_store import Neo4jGraphStore

    store = Neo4jGraphStore.from_settings(_settings())
    try:
        store.ensure_schema()
        done, skipped = store.reindex()
        click.echo(f"reindexed {done} episodes" + (f", skipped {skipped} (see the log)" if skipped else ""))
    finally:
        store.close()


@main.command()
@click.option("--timeout", "timeout_s", type=float, default=3.0, show_default=True)
def health(timeout_s: float) -> None:
    """Exit 0 when Redis, Neo4j and at least one worker answer."""
    from api_stub.client import MemoryClient

    client = MemoryClient(_settings())
    checks = client.health(timeout_s)
    client.close()
    for name, up in checks.items():
        click.echo(f"{name}: {'ok' if up else 'unavailable'}")
    ok = all(checks.values())
    try:
        from worker.celery_app import app

        replies = app.control.ping(timeout=timeout_s) or []
        click.echo(f"workers: {len(replies)}")
        ok = ok and bool(replies)
    except Exception as exc:
        ok = False
        click.echo(f"workers: unknown ({type(exc).__name__})")
    sys.exit(0 if ok else 1)


@main.command()
@click.option("--host", default=None, help="Listen address (default MEMORY_HTTP_HOST).")
@click.option("--port", type=int, default=None, help="Port (default MEMORY_HTTP_PORT).")
def serve(host: str | None, port: int | None) -> None:
    """Serve the HTTP facade (POST /v1/episodes, POST /v1/recall, DELETE /v1/users/{id}/memory, /healthz,
    /metrics, /docs). Refuses to start without MEMORY_HTTP_TOKEN unless MEMORY_HTTP_AUTH_DISABLED=true."""
    import uvicorn

    from api_stub.http_app import create_app
    from worker.log_fields import log_to_stderr

    settings = _settings()
    log_to_stderr()
    try:
        app = create_app(settings)
    except MemoryServiceError as exc:
        raise click.ClickException(str(exc)) from None
    uvicorn.run(app, host=host or settings.http_host, port=port or settings.http_port, log_level="info")


@main.command()
@click.option("--address", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=5555, show_default=True)
@click.option("--persistent", is_flag=True, help="Keep Flower's task history in --db across restarts.")
@click.option("--db", default=".var/flower.db", show_default=True)
@click.option("--insecure-no-auth", is_flag=True, help="Run without basic auth (never in production).")
def flower(address: str, port: int, persistent: bool, db: str, insecure_no_auth: bool) -> None:
    """Start Flower on the broker, with basic auth from MEMORY_FLOWER_USER / MEMORY_FLOWER_PASSWORD."""
    import os

    settings = _settings()
    env = dict(os.environ)
    if settings.flower_user and settings.flower_password:
        password = settings.flower_password.get_secret_value()
        if re.search(r"[:,]", settings.flower_user) or "," in password:
            raise click.ClickException("MEMORY_FLOWER_USER may not hold ':' or ','; MEMORY_FLOWER_PASSWORD not ','")
        env["FLOWER_BASIC_AUTH"] = f"{settings.flower_user}:{password}"  # in the environment, not in `ps`
    elif not insecure_no_auth:
        raise click.ClickException(
            "Flower needs credentials: set MEMORY_FLOWER_USER and MEMORY_FLOWER_PASSWORD "
            "(or pass --insecure-no-auth on a machine nobody else can reach)"
        )
    else:
        env.pop("FLOWER_BASIC_AUTH", None)
    argv = [sys.executable, "-m", "celery", "-A", "worker.celery_app", "flower", f"--address={address}"]
    argv += [f"--port={port}"]
    if persistent:
        argv += ["--persistent=True", f"--db={db}"]
    os.execvpe(argv[0], argv, env)  # Flower takes this process over: signals reach it directly


@main.command()
@click.option("--markdown", "form", flag_value="markdown", default=True, help="The README's settings table.")
@click.option("--env", "form", flag_value="env", help="deploy/.env.example.")
def config(form: str) -> None:
    """Print the configuration reference generated from the settings class."""
    from worker.settings_doc import env_example, markdown_table

    click.echo(markdown_table() if form == "markdown" else env_example(), nl=False)


if __name__ == "__main__":
    main()
