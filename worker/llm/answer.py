"""Read a model's JSON answer: bare, or wrapped in a markdown fence, validated by a pydantic model."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from worker.models import Entity, ExtractionResult, Relationship

T = TypeVar("T", bound=BaseModel)

_FENCE = re.compile(r"^\s*```[A-Za-z]*[ \t]*\n?(.*?)\n?\s*```\s*$", re.DOTALL)
_OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


def _body(text: str) -> str:
    fenced = _FENCE.match(text)
    return fenced.group(1) if fenced else text.strip()


def parse_answer(text: str, model: type[T]) -> T:
    """Raises pydantic.ValidationError for invalid JSON and for JSON that does not fit the model."""
    return model.model_validate_json(_body(text))


@dataclass(frozen=True)
class Dropped:
    """Items of an answer left out because they did not validate (counts only, never their text)."""

    entities: int = 0
    relationships: int = 0


def parse_extraction(text: str, *, lenient: bool = False) -> tuple[ExtractionResult, Dropped]:
    """An extraction answer, item by item: an entity or relationship that does not validate (an empty name,
    a missing end, a weight that is not a number) is left out and counted, the rest kept, so one bad item
    costs neither the answer nor a second call. Raises pydantic.ValidationError when the answer as a whole is
    unusable (not JSON, not an object, no valid summary, unknown fields, entities not a list, more items
    than allowed) and, unless `lenient`, when more items of a list are invalid than valid: an answer mostly
    off the schema (every entity a bare string, an extra key in each) is asked again, not kept empty."""
    raw = _OBJECT.validate_json(_body(text))
    kept: dict[str, Any] = dict(raw)
    dropped: dict[str, int] = {}
    for field, item_model in (("entities", Entity), ("relationships", Relationship)):
        items = raw.get(field)
        if not isinstance(items, list):
            continue  # absent (defaults) or malformed (the whole answer is refused below)
        kept[field] = [item for item in items if _valid(item_model, item)]
        dropped[field] = len(items) - len(kept[field])
        if not lenient and dropped[field] > len(kept[field]):
            ExtractionResult.model_validate(raw)  # raises, with the reasons the re-ask sends back
    result = ExtractionResult.model_validate(kept)
    return result, Dropped(dropped.get("entities", 0), dropped.get("relationships", 0))


def _valid(model: type[BaseModel], item: object) -> bool:
    try:
        model.model_validate(item)
    except ValidationError:
        return False
    return True
