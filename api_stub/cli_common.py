"""What every memctl command needs: the settings (a clear error when they are invalid) and a Redis client."""

from __future__ import annotations

from typing import Any

import click

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
