"""Pure functions: normalisation, ids, Lucene escaping, rank fusion, save parameters, validation, settings."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from tests.factories import entities, record, relation
from worker.errors import EpisodeRejected, SettingsError
from worker.graph.lucene import build_query, content_terms, escape_text, phrase
from worker.graph.params import build_save_params
from worker.identity import derive_episode_id, entity_uid, normalize_name
from worker.models import Limits, Relationship, build_episode
from worker.settings import Settings


def test_names_normalise_case_width_and_spaces() -> None:
    assert normalize_name("  Ａｌｉｃｅ \t  SMITH ") == "alice smith"
    assert normalize_name("北京") == "北京"
    assert normalize_name("ＡＢＣ１２３") == "abc123"


def test_entity_uid_is_per_user() -> None:
    assert entity_uid("u1", "alice") == entity_uid("u1", "alice")
    assert entity_uid("u1", "alice") != entity_uid("u2", "alice")


def test_episode_id_is_deterministic_and_content_sensitive() -> None:
    a = derive_episode_id("u", "s", [("user", "hi")])
    assert a == derive_episode_id("u", "s", [("user", "hi")])
    assert a != derive_episode_id("u", "s", [("user", "hi!")])
    assert a != derive_episode_id("u2", "s", [("user", "hi")])


def test_escaped_text_has_no_live_syntax() -> None:
    assert escape_text('a AND b* "c" user_id:x') == 'a and b\\* \\"c\\" user_id\\:x'
    assert escape_text("}) RETURN e //") == "\\}\\) RETURN e \\/\\/"
    assert phrase('say "hi" \\') == '"say \\"hi\\" \\\\"'


def test_query_is_none_when_nothing_searchable() -> None:
    assert build_query("utag", ["*", "?"], "*** ::") is None
    query = build_query("utag", ["New York"], "weather?")
    assert query == '+user_tag:utag +("New York"^2 weather\\?)'


def test_function_words_are_not_search_terms_unless_nothing_else_is_left() -> None:
    assert content_terms("What food must I avoid?") == "food must avoid?"
    assert content_terms("What is it?") == "What is it?"
    assert content_terms("北京冬天冷吗 and my Lisbon") == "北京冬天冷吗 Lisbon"
    assert build_query("t", [], "where is my sister") == "+user_tag:t +(sister)"


def test_long_text_is_cut_to_bound_clause_count() -> None:
    query = build_query("t", [], "词" * 5000)
    assert query is not None and len(query) < 300


def test_save_params_merge_names_and_create_missing_relationship_ends() -> None:
    params = build_save_params(
        [
            (
                record("u", "x"),
                [*entities("Alice", "ＡＬＩＣＥ "), *entities("Bob", type_="other")],
                [relation("alice", "Carol", 0.25), relation("Alice", "carol", 0.5, "met"), relation("Bob", "Dan")],
            )
        ]
    )
    keys = sorted(e["key"] for e in params.entities)
    assert keys == ["alice", "bob", "carol", "dan"]
    carol = next(e for e in params.entities if e["key"] == "carol")
    assert carol["type"] == "other"
    assert len(params.relationships) == 2
    merged = next(r for r in params.relationships if r["description"] == "met")
    assert merged["weight"] == pytest.approx(0.75)


def test_relationship_weight_stays_float() -> None:
    assert Relationship(source="a", target="b", weight=0.35).weight == 0.35
    with pytest.raises(ValueError):
        Relationship(source="a", target="b", weight=float("nan"))


LIMITS = Limits(max_messages=3, max_message_chars=10, max_episode_chars=15)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"user_id": "", "session_id": "s", "messages": [{"role": "user", "content": "hi"}]}, "user_id"),
        ({"user_id": "u", "session_id": " ", "messages": [{"role": "user", "content": "hi"}]}, "session_id"),
        ({"user_id": "u", "session_id": "s", "messages": []}, "messages"),
        ({"user_id": "u", "session_id": "s", "messages": [{"role": "bot", "content": "hi"}]}, "messages.0.role"),
        ({"user_id": "u", "session_id": "s", "messages": [{"role": "user", "content": "  "}]}, "messages.0.content"),
        (
            {"user_id": "u", "session_id": "s", "messages": [{"role": "user", "content": "x" * 11}]},
            "messages.0.content",
        ),
        ({"user_id": "u", "session_id": "s", "messages": [{"role": "user", "content": "x"}] * 4}, "messages"),
        ({"user_id": "u", "session_id": "s", "messages": [{"role": "user", "content": "x" * 8}] * 2}, "messages"),
        ({"user_id": "u\x00", "session_id": "s", "messages": [{"role": "user", "content": "hi"}]}, "user_id"),
    ],
)
def test_bad_episode_input_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(EpisodeRejected) as info:
        build_episode(limits=LIMITS, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_naive_occurred_at_is_rejected() -> None:
    with pytest.raises(EpisodeRejected) as info:
        build_episode("u", "s", [{"role": "user", "content": "hi"}], limits=LIMITS, occurred_at=datetime(2026, 1, 1))
    assert info.value.field == "occurred_at"


def test_valid_episode_gets_derived_id() -> None:
    episode = build_episode("u", "s", [{"role": "user", "content": "hi"}], limits=LIMITS)
    assert episode.id == derive_episode_id("u", "s", [("user", "hi")])


def test_settings_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_RECALL_LIMIT", "0")
    monkeypatch.setenv("MEMORY_NEO4J_URI", "http://x")
    with pytest.raises(SettingsError) as info:
        Settings.load()
    text = str(info.value)
    assert "MEMORY_RECALL_LIMIT" in text and "MEMORY_NEO4J_URI" in text


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MEMORY_REDIS_URL": "unix:///tmp/redis.sock"}, "MEMORY_REDIS_URL"),  # Celery cannot use it
        ({"MEMORY_REDIS_URL": "redis://127.0.0.1:notaport/0"}, "MEMORY_REDIS_URL"),
        ({"MEMORY_REDIS_URL": "redis://127.0.0.1:70000/0"}, "MEMORY_REDIS_URL"),
        ({"MEMORY_LLM_CONTEXT_TOKENS": "4096"}, "MEMORY_LLM_MAX_TOKENS"),  # 2 x 2000 + 200 leave nothing
    ],
)
def test_settings_that_would_fail_every_worker_or_extraction_are_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    """Each was accepted and then failed later: workers restarting forever, a traceback in every command, or
    every episode dead-lettered."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        Settings.load()
    assert named in str(info.value)
    monkeypatch.setenv("MEMORY_LLM_MAX_TOKENS", "1000")
    monkeypatch.setenv("MEMORY_REDIS_URL", "rediss://user:pw@127.0.0.1:6380/0")
    assert Settings.load().llm_context_tokens in (None, 4096)  # room enough, and a valid URL


def test_a_dotenv_that_is_not_utf8_is_a_settings_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / ".env").write_bytes(b"MEMORY_RECALL_LIMIT=\xff\xfe5\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError) as info:
        Settings.load()
    assert ".env" in str(info.value)


# What the strict structured-output schemas of the providers reached through litellm accept (documented
# rules): OpenAI strict requires every object to list all properties in `required` and to forbid additional
# ones, and rejects `default` and string lengths; Gemini's response schema takes no `$ref`/`$defs`.
_NEVER = {"$ref", "$defs", "default", "minLength", "maxLength", "title", "allOf", "oneOf", "not", "patternProperties"}
_NEVER |= {"anyOf"}  # a nullable field must be written as a type list, which Gemini does not take either
_TYPES = {"string", "number", "integer", "boolean", "array", "object"}


def _portability_problems(node: object, path: str = "$") -> list[str]:
    if isinstance(node, list):
        return [p for i, item in enumerate(node) for p in _portability_problems(item, f"{path}[{i}]")]
    if not isinstance(node, dict):
        return []
    problems = [f"{path}: {key}" for key in node if key in _NEVER]
    if "type" in node and node["type"] not in _TYPES:
        problems.append(f"{path}: type {node['type']}")
    if node.get("type") == "object":
        if node.get("additionalProperties") is not False:
            problems.append(f"{path}: additionalProperties must be false")
        if sorted(node.get("required", [])) != sorted(node.get("properties", {})):
            problems.append(f"{path}: every property must be required")
    for name, sub in node.get("properties", {}).items():
        if not isinstance(sub, dict) or "type" not in sub:
            problems.append(f"{path}.{name}: no type")
    for key, value in node.items():
        if key == "properties":
            problems += [p for name, sub in value.items() for p in _portability_problems(sub, f"{path}.{name}")]
        elif isinstance(value, dict | list):
            problems += _portability_problems(value, f"{path}.{key}")
    return problems


def test_the_answer_schemas_sent_to_providers_follow_the_strict_output_rules() -> None:
    from worker.models import ExtractionResult
    from worker.prompts import keywords
    from worker.prompts.portable_schema import portable_schema

    assert _portability_problems(ExtractionResult.model_json_schema())  # pydantic's own schema does not
    for model in (ExtractionResult, keywords.ResponseModel):
        schema = portable_schema(model)
        assert _portability_problems(schema) == [], model
        assert schema["properties"].keys() == model.model_json_schema()["properties"].keys()  # nothing lost
    # An answer written to the portable schema is a valid answer for the model.
    entity = {"name": "Anna", "type": "person", "description": ""}
    relationship = {"source": "Anna", "target": "Lisbon", "description": "lives in", "weight": 1.0}
    ExtractionResult.model_validate({"summary": "s", "entities": [entity], "relationships": [relationship]})
