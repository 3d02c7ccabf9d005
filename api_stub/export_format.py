"""The export format: JSON Lines, one object a line, each with its `kind`.

    header        format, version, user_id, exported_at, counts read when the export began
    episode ...   one per episode: its content and times, how it was extracted, and what it added (entities
                  with the description it gave, relationships with the weight it added, window embeddings)
    entity ...    one per entity: name, type, description, mentions, first and last seen
    relationship  one per relationship: source and target names, description, weight, support
    session ...   one per session: how far its messages are extracted (the line a later send is checked on)
    end           how many lines of each kind were written: a file without it was cut short

The kinds come in that order. Version 2 (version 1 lacks facts' predicates and times; still read); a reader
refuses versions it does not know. Entity and relationship
lines are what the episodes add up to: an import recomputes mentions, weight and support from the episodes
and takes only the details from these lines.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from worker.facts_text import DEFAULT_PREDICATE, normalize_predicate
from worker.graph.params import spans_from_windows, windows
from worker.models import Entity, ExtractionDetails, FactEnd, Identifier, Name, Relationship, within_calendar

VERSION = 2  # 2: relationships' predicates and times, episodes' ended facts
READABLE = (1, 2)
KINDS = ("header", "episode", "entity", "relationship", "session", "end")

Text = Annotated[str, StringConstraints(max_length=2000)]


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Counts(_Line):
    episodes: int = Field(ge=0)
    entities: int = Field(ge=0)
    relationships: int = Field(ge=0)
    sessions: int = Field(ge=0)


class HeaderLine(_Line):
    kind: Literal["header"] = "header"
    format: Literal["memory-export"] = "memory-export"
    version: int
    user_id: Identifier
    exported_at: AwareDatetime
    counts: Counts
    # The model the window embeddings were made with (None: none were): an import into a deployment with
    # another model (or none) leaves them out, as vectors of one model mean nothing to another.
    embedding_model: str | None = None


class EpisodeLine(ExtractionDetails):
    kind: Literal["episode"] = "episode"
    id: Identifier
    session_id: Identifier
    summary: Annotated[str, StringConstraints(max_length=10_000)]
    content: str | None
    created_at: AwareDatetime
    occurred_at: AwareDatetime | None = None
    source_digest: str = ""
    accepted_at: float | None = None  # when the exporting deployment accepted it (an import accepts it anew)
    entities: list[Entity] = Field(default_factory=list, max_length=10_000)
    relationships: list[Relationship] = Field(default_factory=list, max_length=10_000)
    # The search windows ([start, end) in content) and their embeddings (packed, worker/llm/embeddings.py),
    # in order: restored exactly, so each embedding stays with its window.
    search_windows: list[tuple[int, int]] = Field(default_factory=list)
    window_vectors: list[str] = Field(default_factory=list)
    # Known facts its extraction ended (entity keys, predicate, when); an import ends them again.
    ended_facts: list[FactEnd] = Field(default_factory=list, max_length=1_000)

    @field_validator("created_at", "occurred_at")
    @classmethod
    def _storable_time(cls, value: datetime | None) -> datetime | None:
        if value is not None and not within_calendar(value):
            raise ValueError("falls outside the calendar (years 1 to 9999) in UTC")
        return value

    @field_validator("window_vectors")
    @classmethod
    def _packed(cls, vectors: list[str]) -> list[str]:
        for vector in vectors:
            try:
                raw = base64.b64decode(vector, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("a window vector is not base64") from None
            if not raw or len(raw) % 2:
                raise ValueError("a window vector is not packed float16 values")
            if not all(math.isfinite(x) for x in struct.unpack(f"<{len(raw) // 2}e", raw)):
                raise ValueError("a window vector holds a value that is not finite")
        return vectors

    @model_validator(mode="after")
    def _windows_fit(self) -> EpisodeLine:
        length = len(self.content or "")
        if any(not 0 <= start < end <= length for start, end in self.search_windows):
            raise ValueError("a window lies outside the content")
        if self.window_vectors and len(self.window_vectors) != len(self.search_windows):
            raise ValueError("one window vector a window is expected")
        if self.search_windows and windows(spans_from_windows(self.search_windows), length) != self.search_windows:
            raise ValueError("the windows are not those of whole messages")
        return self


class EntityLine(_Line):
    kind: Literal["entity"] = "entity"
    name: Name
    type: Annotated[str, StringConstraints(max_length=64)]
    description: Text
    mentions: int = Field(ge=0)
    first_seen: AwareDatetime
    last_seen: AwareDatetime


class RelationshipLine(_Line):
    kind: Literal["relationship"] = "relationship"
    source: Name
    target: Name
    predicate: Annotated[str, AfterValidator(normalize_predicate)] = DEFAULT_PREDICATE  # version 1: the default
    description: Text
    weight: float
    support: int = Field(ge=0)
    # A fact's times (worker/graph/facts.py); version 1 files have none.
    valid_from: AwareDatetime | None = None
    invalid_from: AwareDatetime | None = None
    ended_by: Identifier | None = None
    replaces: list[str] = Field(default_factory=list, max_length=1_000)
    # Made current again after it ended: by which episode, and what it was before (forgetting that one puts it back).
    reopened_by: Identifier | None = None
    before_valid_from: AwareDatetime | None = None
    before_invalid_from: AwareDatetime | None = None
    before_ended_by: Identifier | None = None


class SessionLine(_Line):
    kind: Literal["session"] = "session"
    session_id: Identifier
    extracted: int = Field(ge=0)
    digest: str
    hashes: list[str] | None = None


class EndLine(_Line):
    kind: Literal["end"] = "end"
    lines: Counts  # written, per kind (may differ from the header's counts: writes went on meanwhile)


BY_KIND: dict[str, type[BaseModel]] = {
    "header": HeaderLine,
    "episode": EpisodeLine,
    "entity": EntityLine,
    "relationship": RelationshipLine,
    "session": SessionLine,
    "end": EndLine,
}
