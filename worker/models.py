"""The data the service accepts, stores and returns, validated with pydantic."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from worker.errors import EpisodeRejected
from worker.facts_text import DEFAULT_PREDICATE, fact_date, normalize_predicate
from worker.identity import derive_episode_id

Role = Literal["user", "assistant", "system", "tool"]
ExtractionKind = Literal["llm", "offline", "degraded"]

# Ids are opaque to us but must be printable and bounded: they end up in keys, logs and Cypher parameters.
Identifier = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")
]
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Message(_Frozen):
    role: Role
    content: Annotated[str, StringConstraints(min_length=1)]

    @field_validator("content")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


class Limits(_Frozen):
    """Input limits (from settings) that an episode is checked against before anything is enqueued."""

    max_messages: int = 500
    max_message_chars: int = 20_000
    max_episode_chars: int = 200_000


class Episode(_Frozen):
    """A conversation to remember, with its deterministic id."""

    id: Identifier
    user_id: Identifier
    session_id: Identifier
    messages: tuple[Message, ...]
    occurred_at: datetime | None = None

    @property
    def text(self) -> str:
        return "\n".join(f"{m.role}: {m.content}" for m in self.messages)


def within_calendar(value: datetime) -> bool:
    """Does an aware time stay within years 1..9999 in UTC? The stores and the Neo4j driver work in UTC:
    year 1 at +14:00, or the end of 9999 at -14:00, would fail there, after the caller was answered."""
    try:
        value.astimezone(UTC)
    except OverflowError:
        return False
    return True


def build_episode(
    user_id: str,
    session_id: str,
    messages: object,
    *,
    limits: Limits,
    episode_id: str | None = None,
    occurred_at: datetime | None = None,
) -> Episode:
    """Validate caller input into an Episode, or raise EpisodeRejected naming the field."""
    try:
        parsed = _EpisodeInput(user_id=user_id, session_id=session_id, messages=messages)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(part) for part in err["loc"]) or None
        raise EpisodeRejected(err["msg"], field) from None
    if not parsed.messages:
        raise EpisodeRejected("at least one message is required", "messages")
    if len(parsed.messages) > limits.max_messages:
        raise EpisodeRejected(f"{len(parsed.messages)} messages; the limit is {limits.max_messages}", "messages")
    total = 0
    for i, message in enumerate(parsed.messages):
        total += len(message.content)
        if len(message.content) > limits.max_message_chars:
            raise EpisodeRejected(
                f"{len(message.content)} characters; the limit is {limits.max_message_chars}",
                f"messages.{i}.content",
            )
    if total > limits.max_episode_chars:
        raise EpisodeRejected(f"{total} characters in all; the limit is {limits.max_episode_chars}", "messages")
    if occurred_at is not None and occurred_at.tzinfo is None:
        raise EpisodeRejected("must be timezone-aware", "occurred_at")
    if occurred_at is not None and not within_calendar(occurred_at):
        raise EpisodeRejected("falls outside the calendar (years 1 to 9999) in UTC", "occurred_at")
    the_id = (
        episode_id
        if episode_id is not None
        else derive_episode_id(parsed.user_id, parsed.session_id, ((m.role, m.content) for m in parsed.messages))
    )
    try:
        return Episode(
            id=the_id,
            user_id=parsed.user_id,
            session_id=parsed.session_id,
            messages=tuple(parsed.messages),
            occurred_at=occurred_at,
        )
    except ValidationError as exc:
        raise EpisodeRejected(exc.errors()[0]["msg"], "episode_id") from None


class _EpisodeInput(_Frozen):
    user_id: Identifier
    session_id: Identifier
    messages: list[Message]


class Entity(_Frozen):
    name: Name = Field(description="The entity's name as written in the conversation.")
    type: Annotated[str, StringConstraints(strip_whitespace=True, max_length=64)] = Field(
        "other", description="person, place, organization, product, event, concept or other."
    )
    description: Annotated[str, StringConstraints(strip_whitespace=True, max_length=2000)] = Field(
        "", description="What the conversation says about the entity, in one sentence."
    )


class Relationship(_Frozen):
    source: Name = Field(description="Name of the entity the relationship starts from.")
    target: Name = Field(description="Name of the entity the relationship points to.")
    predicate: Annotated[str, StringConstraints(max_length=200)] = Field(
        DEFAULT_PREDICATE, description="The relation in a few words, snake_case: lives_in, works_at, sister_of."
    )
    description: Annotated[str, StringConstraints(strip_whitespace=True, max_length=2000)] = Field(
        "", description="How source relates to target, in a short phrase."
    )
    weight: float = Field(1.0, ge=0.0, le=1_000_000.0, description="Strength of the relationship (float).")
    valid_from: Annotated[str, StringConstraints(max_length=40)] = Field(
        "", description="When it became true (YYYY-MM-DD), if the conversation says; else empty."
    )
    ends: list[Annotated[str, StringConstraints(max_length=40)]] = Field(
        default_factory=list, max_length=50, description="Ids of known facts this one replaces (they stop being true)."
    )

    @field_validator("weight")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("predicate")
    @classmethod
    def _predicate(cls, value: str) -> str:
        return normalize_predicate(value)

    @field_validator("valid_from")
    @classmethod
    def _date(cls, value: str) -> str:
        return fact_date(value)


class ExtractionResult(_Frozen):
    summary: Annotated[str, StringConstraints(strip_whitespace=True, max_length=10_000)] = Field(
        description="A short summary of what the user said, in the conversation's language."
    )
    entities: list[Entity] = Field(default_factory=list, max_length=500)
    relationships: list[Relationship] = Field(default_factory=list, max_length=1000)
    ends: list[Annotated[str, StringConstraints(max_length=40)]] = Field(
        default_factory=list, max_length=50, description="Ids of known facts the new messages say stopped being true."
    )


class ExtractionDetails(_Frozen):
    """How an episode's memory was extracted, as recorded on the episode (and in an export)."""

    extraction: ExtractionKind
    model: str
    prompt_version: str = ""
    message_count: int = Field(0, ge=0)
    llm_calls: int = Field(0, ge=0)
    prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(0, ge=0)
    cost_usd: float = Field(0.0, ge=0)
    # Entities and relationships of the model's answer left out because they did not validate (counts).
    dropped_entities: int = Field(0, ge=0)
    dropped_relationships: int = Field(0, ge=0)
    # Windows of messages the conversation was extracted in: more than one when it did not fit the model's
    # context window (worker/llm/window.py); one LLM call each, re-asks aside.
    windows: int = Field(1, ge=1)


class FactEnd(_Frozen):
    """A known fact (a relationship offered to the model with an id) that an episode's extraction says stopped
    being true: by entity keys and predicate, so it reads the same for any user id (an import elsewhere)."""

    source_key: str
    predicate: str
    target_key: str
    at: AwareDatetime | None = None  # when it stopped: the replacing fact's valid_from; None: the episode's time
    # The fact that replaces it, by (source key, predicate, target key); empty: ended without a replacement.
    replaced_by: tuple[str, ...] = ()


class EpisodeRecord(ExtractionDetails):
    """An episode as persisted: the conversation plus how its memory was extracted."""

    id: Identifier
    user_id: Identifier
    session_id: Identifier
    summary: str
    content: str | None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    occurred_at: datetime | None = None
    # Where each message stands in `content` ([start, end) character offsets): the units recall searches.
    # Not a stored property of the episode; the search windows are built from it.
    message_spans: tuple[tuple[int, int], ...] = ()
    # One packed embedding per search window (worker/llm/embeddings.py), when a model is configured; not a
    # stored property of the episode either.
    window_vectors: tuple[str, ...] = ()
    # Digest of the history sent (all its messages): an episode id sent again with other content is a
    # conflict, not a redelivery.
    source_digest: str = ""
    # When add_episode accepted it (epoch seconds, the caller's clock): work accepted before the user was
    # erased is dropped. None: unknown (a payload from before this field), never dropped.
    accepted_at: float | None = None
    # Known facts this extraction ended (worker/known_facts.py); stored on the episode as end_* lists.
    ended_facts: tuple[FactEnd, ...] = ()


class SessionProgress(_Frozen):
    """The session's extracted line: the history of the last persisted send, as one short hash per message
    (`hashes`), with its length and digest. `start` is where this send's extraction began (the messages
    before it were extracted by earlier sends), so the persist transaction can tell whether the line moved
    since the extraction was planned."""

    key: str
    user_id: str
    session_id: str
    extracted: int = Field(ge=0)
    digest: str
    hashes: tuple[str, ...] = ()
    start: int = Field(0, ge=0)
    erased_at: float = 0.0  # the user's last erasure when the extraction was planned (a later one: plan again)


SaveOutcome = Literal["created", "exists", "forgotten", "unchanged", "conflict", "moved", "erasing"]


class SaveResult(_Frozen):
    """created: written now; exists: this very send was already stored (a redelivery); forgotten: accepted
    before its user was erased, dropped; unchanged: the session's line already holds every message;
    conflict: the episode id is stored with other content; moved: the session's line moved since the
    extraction was planned, so part of it was extracted by another send (extract again); erasing: an erasure
    of the user is deleting right now (try again after it). Only `created`
    writes the episode."""

    episode_id: str
    created: bool  # False: nothing of the episode was written
    entities: int = 0
    relationships: int = 0
    outcome: SaveOutcome = "exists"


class EpisodeHit(_Frozen):
    id: str
    user_id: str
    session_id: str
    summary: str
    created_at: datetime
    occurred_at: datetime | None = None
    extraction: str = ""
    score: float
    matched_by: list[str] = Field(default_factory=list)
    passage: str = ""  # the part of the conversation that matched (bounded), empty when none is stored


class EntityHit(_Frozen):
    uid: str
    user_id: str
    name: str
    type: str
    description: str
    mentions: int
    hop: int = 0  # 0: mentioned by a returned episode; 1: related to such an entity (one hop in the graph)


class RelationHit(_Frozen):
    user_id: str
    source: str
    target: str
    predicate: str = DEFAULT_PREDICATE
    description: str
    weight: float
    valid_from: datetime | None = None  # None: stored before facts had times
    invalid_from: datetime | None = None  # when it stopped being true; None: current
    current: bool = True  # true (as of the recall's as_of, when given): current facts come first


class MemoryContext(_Frozen):
    """What recall returns: the most relevant episodes, their entities and relations."""

    related_episodes: list[EpisodeHit] = Field(default_factory=list)
    related_entities: list[EntityHit] = Field(default_factory=list)
    related_relations: list[RelationHit] = Field(default_factory=list)
    degraded: bool = False
    reason: str | None = None


class DeleteReport(_Frozen):
    user_id: str
    episodes: int
    entities: int
    relationships: int
    session_progress: int = 0


class StoreStats(_Frozen):
    episodes: int
    entities: int
    relationships: int
    users: int
