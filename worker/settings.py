"""One settings object, read from MEMORY_* environment variables (and a .env file), validated at start."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

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
    neo4j_tx_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Server-side timeout of every write transaction (lock waits included)."
    )

    llm_model: str = Field(
        "offline", min_length=1, description="litellm model string; 'offline' is the local deterministic extractor."
    )
    llm_fallback_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated models tried in order when the primary fails with a transient or provider error.",
    )
    llm_api_base: str | None = Field(None, description="Base URL for the LLM provider (OpenAI-compatible servers).")
    llm_api_key: SecretStr | None = Field(None, description="API key passed to litellm (else the provider's own env).")
    llm_timeout_s: float = Field(60.0, gt=0, le=600, description="Timeout of one LLM call.")
    llm_max_tokens: int = Field(2000, ge=64, le=100_000, description="Most tokens the LLM may answer with.")
    llm_context_tokens: int | None = Field(
        None,
        ge=1_000,
        le=10_000_000,
        description="The models' input window in tokens; a longer conversation is extracted in windows "
        "(unset: litellm's model info; a model it does not know gets the whole conversation).",
    )
    llm_structured_output: Literal["auto", "json_schema", "json_object"] = Field(
        "auto",
        description="auto: JSON schema where litellm says the model supports it, else JSON mode with the schema "
        "in the prompt.",
    )
    llm_requests_per_minute: int = Field(
        0, ge=0, le=1_000_000, description="LLM calls per minute shared by all processes (0: no limit)."
    )
    prompt_extraction_file: Path | None = Field(None, description="File whose text replaces the extraction prompt.")
    prompt_keywords_file: Path | None = Field(None, description="File whose text replaces the keywords prompt.")
    max_keywords: int = Field(8, ge=1, le=64, description="Most keywords used for one recall query.")
    llm_keywords_enabled: bool = Field(False, description="Ask the LLM for recall keywords (within the budget).")
    keywords_budget_ms: int = Field(300, ge=1, le=60_000, description="Time allowed for LLM keywords in recall.")
    keywords_cache_ttl_s: int = Field(86_400, ge=1, description="How long LLM keywords stay cached in Redis.")
    recall_limit: int = Field(5, ge=1, le=100, description="Episodes returned by recall when no limit is given.")
    embedding_model: str | None = Field(
        None,
        description="litellm model that embeds search windows (unset: lexical and graph recall only).",
    )
    embedding_query_model: str | None = Field(
        None, description="litellm model that embeds recall queries (unset: the embedding model)."
    )
    embedding_api_base: str | None = Field(None, description="Base URL of the embedding provider.")
    embedding_api_key: SecretStr | None = Field(None, description="API key for the embedding provider.")
    embedding_timeout_s: float = Field(30.0, gt=0, le=600, description="Timeout of one embedding call.")
    embedding_budget_ms: int = Field(
        300, ge=1, le=60_000, description="Time recall waits for the query's embedding (else lexical only)."
    )
    recall_dense_weight: float = Field(
        1.0,
        ge=0.0,
        le=10.0,
        description="Weight of the embedding list in recall's rank fusion (with a model; the text list weighs 1).",
    )

    max_messages: int = Field(500, ge=1, le=100_000, description="Most messages accepted in one episode.")
    max_message_chars: int = Field(20_000, ge=1, le=10_000_000, description="Most characters accepted in one message.")
    max_episode_chars: int = Field(
        200_000, ge=1, le=100_000_000, description="Most characters accepted over all messages of an episode."
    )
    max_in_flight: int = Field(
        100_000,
        ge=1,
        le=100_000_000,
        description="Most episodes accepted and not final yet; beyond it add_episode refuses with QueueFull "
        "(HTTP 503) until the workers catch up, instead of filling Redis.",
    )
    task_time_limit_s: int = Field(300, ge=5, le=3600, description="Hard time limit of one task run.")
    shutdown_grace_s: float = Field(
        150.0,
        ge=1,
        le=3600,
        description="On stop, how long `memctl worker` lets running tasks finish before it kills them "
        "(the container's stop grace must be longer).",
    )
    retry_backoff_base_s: float = Field(2.0, gt=0, le=600, description="First retry delay (doubles each attempt).")
    retry_backoff_cap_s: float = Field(600.0, gt=0, le=86_400, description="Longest delay between two retries.")
    retry_max_attempts: int = Field(
        10, ge=0, le=100, description="Retries of one stage before the episode goes to the dead-letter store."
    )
    max_deliveries: int = Field(
        5, ge=1, le=100, description="Deliveries of one message that never finished before it is dead-lettered."
    )
    visibility_timeout_s: int = Field(
        3600,
        ge=5,
        description="Seconds before Redis hands an unacknowledged message to another worker; must exceed the "
        "longest retry delay plus the task time limit.",
    )
    unacked_restore_interval_s: int = Field(
        10, ge=1, le=3600, description="kombu: seconds between sweeps for messages past the visibility timeout."
    )
    unacked_restore_throttle: int = Field(
        10, ge=1, le=1000, description="kombu: only every Nth sweep scans Redis (1: every sweep)."
    )
    sweep_interval_s: int = Field(
        15,
        ge=1,
        le=86_400,
        description="How often `memctl worker` looks for episodes gone silent and messages of lost workers.",
    )
    worker_dead_after_s: int = Field(
        30,
        ge=10,
        le=3_600,
        description="A worker silent this long (heartbeat every 5 s) is taken for lost: its messages go back.",
    )
    sweep_grace_s: int = Field(
        60,
        ge=0,
        le=86_400,
        description="An episode silent this long that no message carries counts as lost (busy broker: at two sweeps).",
    )
    persist_inline: bool = Field(
        True,
        description="The extract task writes its extraction itself (one Celery task per episode); the persist "
        "queue carries only what that write could not do, and replays (false: every extraction goes through it).",
    )
    persist_batch: int = Field(
        50,
        ge=1,
        le=1_000,
        description="Most episodes one persist transaction writes together when many wait (1: each alone).",
    )
    events_flush_ms: int = Field(
        50,
        ge=0,
        le=10_000,
        description="How long a worker gathers task events (for Flower) before it sends them in one message "
        "(0: on the event loop's next turn, as Celery does).",
    )
    ack_batch_ms: int = Field(
        5,
        ge=0,
        le=1_000,
        description="How long a worker gathers message acknowledgements before it removes them from Redis's "
        "unacked hash in one round trip (0: one round trip each, as kombu does).",
    )
    fetch_batch: int = Field(
        16,
        ge=1,
        le=1_000,
        description="Most messages a worker takes from its queue in one round trip when many wait, within its "
        "prefetch (1: one message per round trip, and another to record it as unacknowledged, as kombu does).",
    )
    task_log_lines: bool = Field(
        False,
        description="Celery's INFO line for every task received and succeeded (two per episode); off (at any "
        "--loglevel), Flower's task events carry the same, and failures, retries and dead letters are logged as "
        "before.",
    )
    persist_batch_wait_ms: int = Field(
        50,
        ge=0,
        le=5_000,
        description="How long a persist batch waits for more episodes once it holds one.",
    )
    extract_read_wait_ms: int = Field(
        20,
        ge=0,
        le=1_000,
        description="How long the read an extraction starts with waits for other extract threads' reads, to "
        "share one query with them (0: each read alone).",
    )
    extract_context_messages: int = Field(
        4, ge=0, le=100, description="Earlier messages sent as context when a session grows."
    )
    extract_known_facts: int = Field(
        20,
        ge=0,
        le=200,
        description="Current facts offered to the model with ids so its answer can end them (0: none).",
    )
    result_expires_s: int = Field(7 * 86_400, ge=60, description="How long task outcomes are kept for wait().")
    recall_budget_ms: int = Field(
        1000, ge=10, le=60_000, description="Time recall may take before it answers (degraded if need be)."
    )
    recall_concurrency: int = Field(
        64,
        ge=1,
        le=4_096,
        description="Recalls one process runs at once; more wait for a slot within their budget.",
    )
    max_query_chars: int = Field(8_000, ge=1, le=1_000_000, description="Most characters in a recall query.")
    store_content: bool = Field(
        True, description="Keep the conversation text on the episode (off: only the summary is stored)."
    )

    http_host: str = Field("127.0.0.1", description="Address `memctl serve` listens on (0.0.0.0 in a container).")
    http_port: int = Field(8080, ge=1, le=65_535, description="Port of the HTTP facade.")
    http_token: SecretStr | None = Field(None, description="Bearer token every HTTP request must carry.")
    http_auth_disabled: bool = Field(
        False, description="Serve HTTP without a token (local development only; refused unless set explicitly)."
    )
    http_max_body_bytes: int = Field(
        2_097_152, ge=1024, le=1_073_741_824, description="Largest HTTP request body accepted (413 beyond)."
    )
    flower_user: str | None = Field(None, description="Flower basic-auth user (`memctl flower`).")
    flower_password: SecretStr | None = Field(None, description="Flower basic-auth password.")

    @field_validator("llm_fallback_models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        if isinstance(value, str):
            return [m.strip() for m in value.split(",") if m.strip()]
        return value

    @field_validator(
        "http_token", "neo4j_password", "llm_api_key", "embedding_api_key", "flower_password", mode="before"
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """`MEMORY_HTTP_TOKEN=` in an env file means "not set", never "the empty secret"."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("http_token")
    @classmethod
    def _strong_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (e.g. `openssl rand -hex 32`)")
        return value

    @field_validator("prompt_extraction_file", "prompt_keywords_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @property
    def silent_episode_s(self) -> float:
        """With the broker idle, an accepted episode silent for this long was lost on the way."""
        return float(self.sweep_grace_s)

    @model_validator(mode="after")
    def _visibility_outlasts_retries(self) -> Settings:
        needed = self.retry_backoff_cap_s + self.task_time_limit_s
        if self.visibility_timeout_s <= needed:
            raise ValueError(
                f"visibility_timeout_s ({self.visibility_timeout_s}) must exceed retry_backoff_cap_s + "
                f"task_time_limit_s ({needed:g}), or Redis would hand a waiting retry to a second worker"
            )
        return self

    @model_validator(mode="after")
    def _room_in_the_window(self) -> Settings:
        """A window set too small for the answer fails every extraction (dead-lettered): say so at start. The
        prompt's own tokens, known only to the model's tokenizer, are checked at the first extraction."""
        window = self.llm_context_tokens
        if window is None:
            return self
        from worker.llm.window import MIN_ROOM, REASK, room_for_messages

        if room_for_messages(window, self.llm_max_tokens) < MIN_ROOM:
            raise ValueError(
                f"llm_context_tokens ({window}) leaves no room for the prompt and the messages after the answer "
                f"and a re-ask of it (twice llm_max_tokens, {self.llm_max_tokens}, plus {REASK}): lower "
                "MEMORY_LLM_MAX_TOKENS or raise MEMORY_LLM_CONTEXT_TOKENS"
            )
        return self

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        """redis:// or rediss:// (Celery's Redis transport and result backend take no unix:// socket URL), with
        a port that is a number: a bad one would surface later as a traceback in a worker or a command."""
        from urllib.parse import urlsplit

        if not value.startswith(("redis://", "rediss://")):
            raise ValueError("must start with redis:// or rediss://")
        try:
            urlsplit(value).port  # noqa: B018  (parsing it is the check)
        except ValueError as exc:
            raise ValueError(f"is not a valid URL ({exc})") from None
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
        except UnicodeDecodeError:  # pydantic-settings reads .env itself
            raise SettingsError([".env: not UTF-8 text"]) from None
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                name = ENV_PREFIX + "_".join(str(part) for part in err["loc"]).upper() if err["loc"] else "settings"
                problems.append(f"{name}: {err['msg']}")
            raise SettingsError(problems) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once on first use (never at import time)."""
    return Settings.load()
