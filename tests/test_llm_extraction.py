"""Extraction through litellm against the stand-in server over real HTTP: answers, re-ask, degraded,
error classification, timeout, fallback — and the number of calls the server saw in each case."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.llm_standin import Reply, StandIn, answer
from worker.errors import LLMError
from worker.extraction import extract
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.llm.client import LLMClient, resolve_routes
from worker.models import Message
from worker.settings import Settings

CONVERSATION = [
    Message(role="user", content="My sister Anna moved to Lisbon. She works at Acme Corp."),
    Message(role="assistant", content="That sounds exciting!"),
]
GOOD = {
    "summary": "The user's sister Anna moved to Lisbon and works at Acme Corp.",
    "entities": [
        {"name": "Anna", "type": "person", "description": "The user's sister"},
        {"name": "Lisbon", "type": "place", "description": "Where Anna moved"},
        {"name": "Acme Corp", "type": "organization", "description": "Anna's employer"},
    ],
    "relationships": [
        {"source": "Anna", "target": "Lisbon", "description": "lives in", "weight": 0.9},
        {"source": "Anna", "target": "Acme Corp", "description": "works at", "weight": 0.8},
    ],
}


def test_correct_answer(standin: StandIn, llm_settings: Settings) -> None:
    standin.push(answer(GOOD))
    extraction = extract(CONVERSATION, settings=llm_settings)
    assert standin.calls == 1
    assert extraction.kind == "llm" and extraction.model == "openai/stand-in"
    assert extraction.result.summary == GOOD["summary"]
    assert [e.name for e in extraction.result.entities] == ["Anna", "Lisbon", "Acme Corp"]
    assert extraction.result.relationships[0].weight == 0.9
    assert extraction.prompt_version == "extraction@v2"
    assert (extraction.usage.calls, extraction.usage.prompt_tokens, extraction.usage.completion_tokens) == (1, 120, 30)
    sent = standin.requests[0]
    assert sent["model"] == "stand-in"
    assert "Anna moved to Lisbon" in sent["messages"][-1]["content"]
    assert sent["response_format"]["type"] in ("json_object", "json_schema")


def test_a_priced_model_records_what_litellm_prices_the_call_at(standin: StandIn, llm_settings: Settings) -> None:
    """The cost is read from the price litellm put on the response (not computed a second time per call)."""
    import litellm

    standin.push(answer(GOOD))
    priced = llm_settings.model_copy(update={"llm_model": "openai/gpt-4o-mini"})
    extraction = extract(CONVERSATION, settings=priced)
    prompt_cost, completion_cost = litellm.cost_per_token(model="gpt-4o-mini", prompt_tokens=120, completion_tokens=30)
    assert extraction.usage.cost_usd > 0
    assert abs(extraction.usage.cost_usd - (prompt_cost + completion_cost)) < 1e-12


def test_answer_in_markdown_fences_is_accepted(standin: StandIn, llm_settings: Settings) -> None:
    standin.push(Reply(content="```json\n" + json.dumps(GOOD) + "\n```"))
    extraction = extract(CONVERSATION, settings=llm_settings)
    assert extraction.kind == "llm" and len(extraction.result.entities) == 3
    assert standin.calls == 1


def test_invalid_json_then_valid_reask(standin: StandIn, llm_settings: Settings) -> None:
    standin.push(Reply(content='{"summary": "Anna moved", "entities": [ oops'), answer(GOOD))
    extraction = extract(CONVERSATION, settings=llm_settings)
    assert standin.calls == 2
    assert extraction.kind == "llm" and extraction.usage.calls == 2
    reask = standin.requests[1]["messages"]
    assert reask[-2] == {"role": "assistant", "content": '{"summary": "Anna moved", "entities": [ oops'}
    assert "could not be used" in reask[-1]["content"]


def test_wrong_schema_twice_degrades_and_keeps_the_text(standin: StandIn, llm_settings: Settings) -> None:
    standin.push(answer({"facts": ["x"]}), answer({"entities": "not a list"}))
    extraction = extract(CONVERSATION, settings=llm_settings)
    assert standin.calls == 2
    assert extraction.kind == "degraded"
    assert extraction.result.entities == [] and extraction.result.relationships == []
    assert "Anna moved to Lisbon" in extraction.result.summary


def test_rate_limited_is_transient_with_the_retry_after(standin: StandIn, llm_settings: Settings) -> None:
    standin.push(Reply(status=429, content="slow down", headers={"Retry-After": "7"}))
    with pytest.raises(LLMError) as info:
        extract(CONVERSATION, settings=llm_settings)
    assert info.value.transient and info.value.retry_after_s == 7.0
    assert standin.calls == 1  # no hidden retry


def test_server_error_is_transient(standin: StandIn, llm_settings: Settings) -> None:
    standin.push(Reply(status=500, content="boom"))
    with pytest.raises(LLMError) as info:
        extract(CONVERSATION, settings=llm_settings)
    assert info.value.transient
    assert standin.calls == 1


def test_authentication_failure_is_permanent(standin: StandIn, llm_settings: Settings) -> None:
    standin.push(Reply(status=401, content="bad key"))
    with pytest.raises(LLMError) as info:
        extract(CONVERSATION, settings=llm_settings)
    assert not info.value.transient
    assert standin.calls == 1


def test_reply_slower_than_the_timeout(standin: StandIn, standin_slow_settings: Settings) -> None:
    standin.push(Reply(content=json.dumps(GOOD), delay_s=3.0))
    with pytest.raises(LLMError) as info:
        extract(CONVERSATION, settings=standin_slow_settings)
    assert info.value.transient
    assert standin.calls == 1


def test_fallback_model_answers_when_the_primary_fails(standin: StandIn, llm_settings: Settings) -> None:
    settings = llm_settings.model_copy(update={"llm_fallback_models": ["openai/stand-in-backup"]})
    standin.push(Reply(status=503, content="overloaded"), answer(GOOD))
    extraction = extract(CONVERSATION, settings=settings)
    assert [r["model"] for r in standin.requests] == ["stand-in", "stand-in-backup"]
    assert extraction.kind == "llm" and extraction.model == "openai/stand-in-backup"


def test_all_models_failing_reports_the_longest_retry_hint(standin: StandIn, llm_settings: Settings) -> None:
    settings = llm_settings.model_copy(update={"llm_fallback_models": ["openai/stand-in-backup"]})
    standin.push(Reply(status=429, headers={"Retry-After": "3"}), Reply(status=429, headers={"Retry-After": "9"}))
    with pytest.raises(LLMError) as info:
        LLMClient(settings).complete(lambda _: [{"role": "user", "content": "hi"}], Message)
    assert info.value.transient and info.value.retry_after_s == 9.0
    assert standin.calls == 2


CHINESE = [Message(role="user", content="我上个月和张伟一起去了北京，北京的冬天很冷。")]


def test_chinese_conversation_through_the_stand_in(standin: StandIn, llm_settings: Settings) -> None:
    good = {
        "summary": "用户上个月和张伟去了北京，觉得北京冬天很冷。",
        "entities": [{"name": "张伟", "type": "person"}, {"name": "北京", "type": "place"}],
        "relationships": [{"source": "张伟", "target": "北京", "description": "去过", "weight": 0.7}],
    }
    standin.push(answer(good))
    extraction = extract(CHINESE, settings=llm_settings)
    assert "张伟一起去了北京" in standin.requests[0]["messages"][-1]["content"]
    assert extraction.result.summary == good["summary"]
    assert {(e.name, e.type) for e in extraction.result.entities} == {("张伟", "person"), ("北京", "place")}


def test_prompt_override_from_a_file_is_sent_and_versioned(
    standin: StandIn, llm_settings: Settings, tmp_path: Path
) -> None:
    custom = tmp_path / "extraction.txt"
    custom.write_text("Extract memories, pirate style.", encoding="utf-8")
    settings = llm_settings.model_copy(update={"prompt_extraction_file": custom})
    standin.push(answer(GOOD))
    extraction = extract(CONVERSATION, settings=settings)
    assert standin.requests[0]["messages"][0]["content"].startswith("Extract memories, pirate style.")
    assert extraction.prompt_version.startswith("extraction@file-")


def test_model_resolution_is_computed_once_per_process(llm_settings: Settings) -> None:
    resolve_routes.cache_clear()
    client = LLMClient(llm_settings.model_copy(update={"llm_fallback_models": ["openai/b", "openai/stand-in"]}))
    first = client.routes
    assert [r.model for r in first] == ["openai/stand-in", "openai/b"]  # ordered, de-duplicated
    assert client.routes is first
    assert resolve_routes.cache_info().hits >= 1


def test_an_invalid_item_is_left_out_and_counted_not_the_whole_answer(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    from worker.models import Limits, build_episode
    from worker.pipeline import episode_payload, extract_stage

    flawed = {
        **GOOD,
        "entities": [*GOOD["entities"], {"name": "", "type": "person"}, {"type": "place"}],
        "relationships": [*GOOD["relationships"], {"source": "Anna", "weight": "very"}],
    }
    standin.push(answer(flawed))
    extraction = extract(CONVERSATION, settings=llm_settings)
    assert standin.calls == 1  # kept without asking again
    assert extraction.kind == "llm"
    assert [e.name for e in extraction.result.entities] == ["Anna", "Lisbon", "Acme Corp"]
    assert len(extraction.result.relationships) == 2
    assert (extraction.dropped.entities, extraction.dropped.relationships) == (2, 1)
    # The counts travel with the episode: on its record (stored with it), counted by the extract task.
    standin.push(answer(flawed))
    messages = [m.model_dump() for m in CONVERSATION]
    payload = episode_payload(build_episode(new_user("dropped"), "s1", messages, limits=Limits()))
    outcome = extract_stage(payload, settings=llm_settings, store=store, llm=None)
    assert (outcome["record"]["dropped_entities"], outcome["record"]["dropped_relationships"]) == (2, 1)


def test_an_answer_mostly_off_the_schema_is_asked_again_and_then_kept_for_what_is_valid(
    standin: StandIn, llm_settings: Settings
) -> None:
    bare = {**GOOD, "entities": ["Anna", "Lisbon", {"name": "Acme Corp"}]}  # names as bare strings
    standin.push(answer(bare), answer(bare))
    extraction = extract(CONVERSATION, settings=llm_settings)
    assert standin.calls == 2  # asked again, not kept with one entity of three
    assert "could not be used" in standin.requests[1]["messages"][-1]["content"]
    assert extraction.kind == "llm" and [e.name for e in extraction.result.entities] == ["Acme Corp"]
    assert extraction.dropped.entities == 2  # the second answer is kept for what is valid, and counted
