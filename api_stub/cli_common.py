"""What memctl commands need: the settings (a clear error when they are invalid), a Redis client, a MemoryClient."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from api_stub.client import MemoryClient

from worker.errors import MemoryServiceError
from worker.settings import Settings


def settings_or_exit() -> Settings:
    try:
        return Settings.load()
    except MemoryServiceError as exc:
        raise click.ClickException(str(exc)) from None


def redis_for(settings: Settings) -> Any:
    from redis import Redis

    return Redis.from_url(settings.redis_url, socket_timeout=5)


@contextmanager
def memory_client() -> Iterator[MemoryClient]:
    """A MemoryClient for one command, closed after it; a service error is the command's clear failure."""
    from api_stub.client import MemoryClient

    client = MemoryClient(settings_or_exit())
    try:
        yield client
    except MemoryServiceError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()
