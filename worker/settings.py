"""One settings object, read from MEMORY_* environment variables (and a .env file), validated at start."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.errors import SettingsError

ENV_PREFIX = "MEMORY_"


class Settings(BaseSettings):
    """Every knob of the service. Each field's description is the documentation of its variable."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_file=".env", env_file_encoding="utf-8", extra="ignore", frozen=True
    )

    redis_url: str = Field("redis://127.0.0.1:16379/0", description="Redis URL: broker, dead letters, caches.")
    neo4j_uri: str = Field("bolt://127.0.0.1:17687", description="Neo4j Bolt URI.")
    neo4j_user: str = Field("neo4j", description="Neo4j user name.")
    neo4j_password: SecretStr | None = Field(None, description="Neo4j password; unset means auth is off.")
    neo4j_database: str = Field("neo4j", description="Neo4j database name.")
    neo4j_connect_timeout_s: float = Field(2.0, gt=0, le=60, description="Timeout to open a Bolt connection.")
    neo4j_retry_time_s: float = Field(
        5.0, ge=0, le=120, description="How long the driver retries a transaction that hit a transient error."
    )
    neo4j_pool_size: int = Field(20, ge=1, le=500, description="Bolt connections per process.")

    llm_model: str = Field("offline", description="litellm model string; 'offline' is the local extractor.")
    recall_limit: int = Field(5, ge=1, le=100, description="Episodes returned by recall when no limit is given.")

    max_messages: int = Field(500, ge=1, le=100_000, description="Most messages accepted in one episode.")
    max_message_chars: int = Field(20_000, ge=1, le=10_000_000, description="Most characters accepted in one message.")
    max_episode_chars: int = Field(
        200_000, ge=1, le=100_000_000, description="Most characters accepted over all messages of an episode."
    )
    max_query_chars: int = Field(4_000, ge=1, le=1_000_000, description="Most characters in a recall query.")
    store_content: bool = Field(
        True, description="Keep the conversation text on the episode (off: only the summary is stored)."
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @field_validator("neo4j_uri")
    @classmethod
    def _neo4j_scheme(cls, value: str) -> str:
        schemes = ("bolt://", "bolt+s://", "bolt+ssc://", "neo4j://", "neo4j+s://", "neo4j+ssc://")
        if not value.startswith(schemes):
            raise ValueError("must start with bolt:// or neo4j:// (optionally +s / +ssc)")
        return value

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Read and validate; errors name the environment variable, not the Python field."""
        try:
            return cls(**overrides)
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                name = ENV_PREFIX + "_".join(str(part) for part in err["loc"]).upper()
                problems.append(f"{name}: {err['msg']}")
            raise SettingsError(problems) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once on first use (never at import time)."""
    return Settings.load()
