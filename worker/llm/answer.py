"""Read a model's JSON answer: bare, or wrapped in a markdown fence, validated by a pydantic model."""

from __future__ import annotations

import re
from typing import TypeVar

from pydantic import BaseModel

T = TypeVar("T", bound=BaseModel)

_FENCE = re.compile(r"^\s*```[A-Za-z]*[ \t]*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def parse_answer(text: str, model: type[T]) -> T:
    """Raises pydantic.ValidationError for invalid JSON and for JSON that does not fit the model."""
    fenced = _FENCE.match(text)
    body = fenced.group(1) if fenced else text.strip()
    return model.model_validate_json(body)
