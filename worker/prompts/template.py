"""A prompt's system text with the version recorded on every episode it produced."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel


@dataclass(frozen=True)
class PromptTemplate:
    version: str
    text: str

    @classmethod
    def load(cls, default: PromptTemplate, override: Path | None) -> PromptTemplate:
        """The built-in prompt, or the text of the override file versioned by its content hash."""
        if override is None:
            return default
        text = override.read_text(encoding="utf-8")
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
        return cls(version=f"{default.version.split('@')[0]}@file-{digest}", text=text)


@lru_cache(maxsize=32)
def schema_json(response_model: type[BaseModel]) -> str:
    """The model's JSON schema as text, built once (it costs milliseconds, and every call needs it)."""
    return json.dumps(response_model.model_json_schema(), ensure_ascii=False)


def system_text(template: PromptTemplate, response_model: type[BaseModel], *, schema_in_prompt: bool) -> str:
    """The system message; in JSON mode (no schema-constrained output) the schema is spelled out in it."""
    if not schema_in_prompt:
        return template.text
    schema = schema_json(response_model)
    return f"{template.text}\n\nAnswer with one JSON object only, matching this JSON schema:\n{schema}"
