"""`memctl export`, `memctl import-memory` and `memctl reextract`: a user's memory as a whole."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from api_stub.cli_common import memory_client


@click.command("export")
@click.option("--user", "user_id", required=True)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None, help="File (default: stdout)."
)
def export(user_id: str, output: Path | None) -> None:
    """Write everything kept about a user as JSON Lines (format: api_stub/export_format.py)."""
    with memory_client() as client:
        lines = client.export_user(user_id)
        if output is None:
            for line in lines:
                sys.stdout.write(line)
            return
        partial = output.with_name(output.name + ".partial")  # the file appears whole, or not at all
        try:
            with (
                partial.open("w", encoding="utf-8") as handle,
                click.progressbar(lines, label="export", file=sys.stderr) as bar,
            ):
                for line in bar:
                    handle.write(line)
            partial.replace(output)
        finally:
            partial.unlink(missing_ok=True)
    click.echo(f"exported user {user_id!r} to {output}", err=True)


@click.command("import-memory")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--as-user", default=None, help="Import under this user id instead of the exported one.")
def import_memory(file: Path, as_user: str | None) -> None:
    """Load an export into this deployment (no LLM call). The whole file is checked first: a bad line is
    named and nothing is written. Idempotent: run it again to finish an import cut short."""
    with file.open(encoding="utf-8", errors="replace") as handle:
        total = sum(1 for text in handle if text.strip())
    with memory_client() as client, click.progressbar(length=total, label="import", file=sys.stderr) as bar:
        report = client.import_memory(file, as_user=as_user, advance=bar.update)
    click.echo(report.model_dump_json())


@click.command()
@click.option("--user", "user_id", default=None, help="Only this user's episodes.")
@click.option("--all", "all_users", is_flag=True, help="Every user's episodes.")
@click.option("--only-degraded", is_flag=True, help="Only episodes whose extraction was degraded.")
@click.option(
    "--extraction-older-than",
    "older_than",
    default=None,
    metavar="PROMPT_VERSION",
    help="Only episodes extracted with an earlier prompt version than this one (e.g. extraction@v2).",
)
@click.option("--dry-run", is_flag=True, help="Say what it would take (episodes, LLM calls, tokens, cost).")
def reextract(user_id: str | None, all_users: bool, only_degraded: bool, older_than: str | None, dry_run: bool) -> None:
    """Extract stored episodes again with the current model and prompt, through the queue (workers do it).
    Each episode's old extraction is replaced exactly; one stored without content is left as it is."""
    if (user_id is None) == (not all_users):
        raise click.UsageError("give --user U or --all")
    with memory_client() as client:
        plan = client.reextract_plan(user_id, only_degraded=only_degraded, older_than=older_than)
        if dry_run:
            click.echo(plan.model_dump_json())
            return
        click.echo(f"plan: {plan.model_dump_json()}", err=True)
        with click.progressbar(length=plan.episodes, label="reextract", file=sys.stderr, show_pos=True) as bar:
            report = client.reextract(user_id, only_degraded=only_degraded, older_than=older_than, advance=bar.update)
    click.echo(report.model_dump_json())
