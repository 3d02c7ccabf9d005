"""The answer schema sent as `response_format` (strict structured output): the pydantic model's JSON schema
cut down to what the providers people reach through litellm all accept.

- OpenAI strict structured outputs: every object lists all its properties in `required` and has
  `additionalProperties: false`; only a subset of JSON Schema keywords is allowed (no `default`, no string
  lengths, no `title` needed).
- Gemini's response schema (an OpenAPI 3.0 subset): no `$ref`/`$defs` (inlined here), no `default`.
- Anthropic (the schema as a tool's input schema): plain JSON Schema; the subset above is valid there.

What is dropped (lengths, bounds, defaults) is still enforced: the answer is validated with the pydantic
model, and a field the model must now always write (a type, a description, a weight) has a meaning when
empty. KEPT lists every keyword that may appear; tests/test_units.py checks the result against these rules.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from pydantic import BaseModel

KEPT = frozenset({"type", "properties", "required", "additionalProperties", "items", "description", "enum"})


@lru_cache(maxsize=32)
def portable_schema_json(response_model: type[BaseModel]) -> str:
    schema = response_model.model_json_schema()
    return json.dumps(_portable(schema, schema.get("$defs", {})), ensure_ascii=False)


def portable_schema(response_model: type[BaseModel]) -> dict[str, Any]:
    return dict(json.loads(portable_schema_json(response_model)))


def _portable(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_portable(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _portable(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    out = {key: _portable(value, defs) for key, value in node.items() if key in KEPT and key != "properties"}
    if "properties" in node:
        out["properties"] = {name: _portable(value, defs) for name, value in node["properties"].items()}
        out["required"] = list(node["properties"])
        out["additionalProperties"] = False
    return out
