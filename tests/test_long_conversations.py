"""A conversation longer than the model's context window is extracted in windows (one call each, entities
merged on their key), never dead-lettered for its length; the stand-in refuses, as a provider does, any
request longer than its window."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from api_stub.client import MemoryClient
from tests.factories import record
from tests.llm_standin import Reply, StandIn, answer, request_tokens
from tests.test_forget_part import entity_rows
from tests.workers import WorkerProcess
from worker.deadletter import DeadLetterStore
from worker.errors import LLMError
from worker.extraction import Extraction, extract, extraction_prompt, merged
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.llm.client import LLMUsage
from worker.llm.window import plan_windows
from worker.models import ExtractionKind, ExtractionResult, Message, Relationship
from worker.settings import Settings

NAMES = ["Adaline", "Bartholomew", "Cordelia", "Desmond", "Evangeline", "Fitzgerald"]
WINDOW = 2_000
FILLER = "we talked about the garden, the weather, the trains and the long walk by the river " * 6


def conversation(n: int = 24) -> list[dict[str, str]]:
    """About 4,000 tokens: each message names one person and carries filler."""
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{NAMES[i % len(NAMES)]} came by. {FILLER}"}
        for i in range(n)
    ]


def as_a_model_would(request: dict[str, Any]) -> Reply:
    """Entities for the names in the new messages only (earlier context is not extracted again)."""
    text = request["messages"][-1]["content"].split("New messages:")[-1]
    names = [n for n in NAMES if re.search(rf"\b{n}\b", text)]
    relationships = [{"source": names[0], "target": n, "description": "met"} for n in names[1:2]]
    return answer(
        {"summary": f"met {', '.join(names)}", "entities": [{"name": n} for n in names], "relationships": relationships}
    )


def test_a_conversation_longer_than_the_window_is_extracted_in_windows_through_the_worker(
    standin: StandIn,
    llm_settings: Settings,
    store: Neo4jGraphStore,
    workers: Callable[..., WorkerProcess],
    new_user: Callable[[str], str],
    clean_redis: Any,
) -> None:
    standin.context_tokens = WINDOW
    standin.default = as_a_model_would
    env = {
        "MEMORY_LLM_MODEL": "openai/stand-in",
        "MEMORY_LLM_API_BASE": standin.url,
        "MEMORY_LLM_API_KEY": "sk-x",
        "MEMORY_LLM_CONTEXT_TOKENS": str(WINDOW),
        "MEMORY_LLM_MAX_TOKENS": "64",
    }
    workers(**env)
    user = new_user("long")
    client = MemoryClient(llm_settings)
    try:
        receipt = client.add_episode(user, "s", conversation())
        assert [s.state for s in client.wait([receipt], timeout_s=90)] == ["persisted"]
    finally:
        client.close()
    assert DeadLetterStore(clean_redis).count() == 0
    sizes = [request_tokens(r) for r in standin.requests]
    assert len(sizes) >= 3 and max(sizes) <= WINDOW, sizes  # every window fit: no call was refused
    with store._session() as s:
        row = s.run(
            "MATCH (e:Episode {id: $id}) RETURN e.windows AS windows, e.llm_calls AS calls, e.extraction AS kind",
            id=receipt.episode_id,
        ).single(strict=True)
    assert (row["windows"], row["calls"], row["kind"]) == (len(sizes), len(sizes), "llm")
    rows = entity_rows(store, user)
    assert set(rows) == set(NAMES) and all(r["mentions"] == 1 for r in rows.values())  # merged on their key


def test_without_a_known_window_the_provider_refusal_is_permanent_and_named(
    standin: StandIn, llm_settings: Settings
) -> None:
    """Before windows (and still for a model litellm does not know, with no MEMORY_LLM_CONTEXT_TOKENS)."""
    standin.context_tokens = WINDOW
    standin.default = as_a_model_would
    messages = [Message.model_validate(m) for m in conversation()]
    with pytest.raises(LLMError) as refused:
        extract(messages, settings=llm_settings.model_copy(update={"llm_max_tokens": 64}))
    assert refused.value.cause == "ContextWindowExceededError" and not refused.value.transient
    windowed = llm_settings.model_copy(update={"llm_max_tokens": 64, "llm_context_tokens": WINDOW})
    result = extract(messages, settings=windowed)
    assert result.windows >= 3 and result.usage.calls == result.windows
    assert sorted(e.name for e in result.result.entities) == sorted(NAMES)


def chars(text: str) -> int:
    return len(text) // 4 + 4


def test_windows_fit_carry_overlap_as_context_and_cut_a_message_longer_than_one(settings: Settings) -> None:
    windowed = settings.model_copy(update={"llm_context_tokens": 3_000, "llm_max_tokens": 100})
    template = extraction_prompt(settings)
    messages = [Message(role="user", content=f"message {i} " + "x" * 600) for i in range(20)]
    windows = plan_windows(messages, [], windowed, template, count=chars)
    assert len(windows) > 1
    assert [m for w in windows for m in w.new] == messages  # every message once, in order
    assert windows[0].context == [] and all(w.context == windows[i].new[-2:] for i, w in enumerate(windows[1:]))
    assert plan_windows(messages[:2], [], windowed, template, count=chars)[0].new == messages[:2]  # fits: one
    huge = Message(role="user", content="y" * 40_000)
    cut = plan_windows([huge], [], windowed, template, count=chars)
    assert len(cut) > 1 and "".join(m.content for w in cut for m in w.new) == huge.content
    assert all(sum(chars(f"{m.role}: {m.content}") for m in w.new) < 3_000 for w in cut)


def part(relationships: list[tuple[str, str, float]], kind: ExtractionKind = "llm") -> Extraction:
    result = ExtractionResult(
        summary="s",
        relationships=[Relationship(source=a, target=b, weight=w, description="") for a, b, w in relationships],
    )
    return Extraction(result, kind, "m", "v", LLMUsage(calls=1, prompt_tokens=10))


def test_windows_merge_a_repeat_within_one_answer_by_sum_and_across_windows_by_the_strongest() -> None:
    joined = merged([part([("Ada", "Bo", 0.5), ("ada", "BO", 0.25)]), part([("Ada", "Bo", 0.5)], "degraded")])
    assert [(r.source, r.target, r.weight) for r in joined.result.relationships] == [("Ada", "Bo", 0.75)]
    assert (joined.windows, joined.usage.calls, joined.kind) == (2, 2, "degraded")


def test_the_dry_run_counts_one_call_a_window(
    settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("long-plan")
    content = "\n".join(f"{m['role']}: {m['content']}" for m in conversation())
    store.save_episode(record(user, content), [], [])
    windowed = settings.model_copy(
        update={"llm_model": "openai/stand-in", "llm_context_tokens": WINDOW, "llm_max_tokens": 64}
    )
    client = MemoryClient(windowed)
    try:
        plan = client.reextract_plan(user)
    finally:
        client.close()
    assert plan.episodes == 1 and plan.llm_calls >= 3 and plan.prompt_tokens > 3_000
