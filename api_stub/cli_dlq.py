"""`memctl dlq`: the dead-letter store's commands (list, show, replay, purge)."""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

import click

from api_stub.cli_common import redis_for, settings_or_exit
from worker.settings import Settings


@click.group()
def dlq() -> None:
    """The dead-letter store: failed episodes, kept until replayed or purged."""


def _store(settings: Settings) -> Any:
    from worker.deadletter import DeadLetterStore

    return DeadLetterStore(redis_for(settings))


@dlq.command("list")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def dlq_list(limit: int, as_json: bool) -> None:
    store = _store(settings_or_exit())
    letters = store.list(limit)
    if as_json:
        rows = [letter.model_dump(exclude={"payload", "traceback"}) for letter in letters]
        click.echo(json.dumps(rows, ensure_ascii=False))
        return
    click.echo(f"{store.count()} dead letters")
    for letter in letters:
        click.echo(
            f"{letter.id}\t{letter.error_class}\tattempts={letter.attempts}\treplays={letter.replay_count}\t"
            f"user={letter.user_id}"
        )


@dlq.command("show")
@click.argument("record_id")
def dlq_show(record_id: str) -> None:
    letter = _store(settings_or_exit()).get(record_id)
    if letter is None:
        raise click.ClickException(f"no dead letter {record_id}")
    click.echo(letter.model_dump_json(indent=2))


def enqueue_letter(client: Any, letter: Any) -> str:
    """Re-enqueue a dead letter at the stage that failed; returns the new final task id."""
    # In flight first, as add_episode does: a replayed message the broker loses is found by the sweep.
    client._in_flight().add(letter.episode_id, letter.user_id, letter.payload)
    return str(client.republish(letter.payload))


@dlq.command("replay")
@click.argument("record_ids", nargs=-1)
@click.option("--all", "replay_all", is_flag=True)
@click.option("--dry-run", is_flag=True)
def dlq_replay(record_ids: tuple[str, ...], replay_all: bool, dry_run: bool) -> None:
    """Re-enqueue records; each is removed only after the broker accepted its new message."""
    from api_stub.client import MemoryClient

    if bool(record_ids) == replay_all:
        raise click.UsageError("give record ids or --all")
    settings = settings_or_exit()
    store = _store(settings)
    ids = store.ids() if replay_all else list(record_ids)
    if dry_run:
        for rid in ids:
            click.echo(f"would replay {rid}")
        return
    client = MemoryClient(settings)
    missing = 0
    with click.progressbar(ids, label="replay", file=sys.stderr) as bar:
        for rid in bar:
            if store.replay(rid, lambda letter: enqueue_letter(client, letter)) is None:
                missing += 1
    click.echo(f"replayed {len(ids) - missing}" + (f", {missing} not found" if missing else ""))
    if missing:
        sys.exit(1)


_AGE = re.compile(r"^(\d+)([smhd])$")


@dlq.command("purge")
@click.argument("record_ids", nargs=-1)
@click.option("--all", "purge_all", is_flag=True)
@click.option("--older-than", default=None, help="e.g. 7d, 12h, 30m")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_purge(record_ids: tuple[str, ...], purge_all: bool, older_than: str | None, yes: bool) -> None:

    if sum([bool(record_ids), purge_all, older_than is not None]) != 1:
        raise click.UsageError("give record ids, --all or --older-than")
    store = _store(settings_or_exit())
    if older_than is not None:
        match = _AGE.match(older_than)
        if not match:
            raise click.UsageError("--older-than takes a number and s, m, h or d (e.g. 7d)")
        seconds = int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
        cutoff = time.time() - seconds
        ids = [letter.id for letter in store.iter_all() if letter.last_failed_at < cutoff]
    else:
        ids = store.ids() if purge_all else list(dict.fromkeys(record_ids))  # an id given twice counts once
    if not yes and not click.confirm(f"purge {len(ids)} dead letters for good?"):
        sys.exit(1)
    removed = sum(store.remove(rid) for rid in ids)
    missing = len(ids) - removed if record_ids else 0  # named ids that were not there (as replay and show say)
    click.echo(f"purged {removed}" + (f", {missing} not found" if missing else ""))
    if missing:
        sys.exit(1)
