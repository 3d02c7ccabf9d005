"""memctl reextract: stored episodes extracted again with the current model and prompt, through the queue.

Each chosen episode is sent as an ordinary extract → persist chain whose payload says `reextract` (a job id):
the extract stage rebuilds the episode's messages from its stored content (`role: text` lines) and extracts
them with no session planning (worker/pipeline.py reextract_stage); the persist stage puts the new
extraction in place of the old one in one transaction, taking back exactly what the old one added
(worker/graph/reextract.py). It is tracked in flight like any episode (a lost message is sent again by the
sweep), and retried and dead-lettered like one. An episode stored without content (MEMORY_STORE_CONTENT=false)
cannot be extracted again: it is counted and left; when every chosen episode is such, the run is refused.

Choices: `--extraction-older-than extraction@vN` chooses episodes whose prompt version number is lower than
N, or that recorded none; the dry run counts prompt tokens with litellm's token counter on the very prompts
each episode would be sent (one per window when it is longer than the model's window, worker/llm/window.py),
estimates completion tokens from the episode's last LLM extraction (a quarter of
the prompt when it had none) and prices both with litellm's price map (unknown there: no cost given).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, get_args

from pydantic import BaseModel

from worker.errors import QueryRejected, QueueFull
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.graph.params import spans_from_content
from worker.llm.window import plan_windows
from worker.models import Episode, Message, Role
from worker.offline import MODEL_NAME as OFFLINE
from worker.pipeline import episode_payload
from worker.settings import Settings

_VERSION = re.compile(r"@v(\d+)")
ROLES = set(get_args(Role))
COMPLETION_SHARE = 0.25  # completion tokens, as a share of the prompt's, for an episode no LLM extracted
QUEUE_FULL_WAIT_S = 600.0


class ReextractPlan(BaseModel):
    episodes: int  # that will be extracted again
    without_content: int  # chosen, but stored without content: left as they are
    llm_calls: int
    prompt_tokens: int
    completion_tokens_estimated: int
    estimated_cost_usd: float | None  # None: the model is not in litellm's price map
    model: str


class ReextractReport(BaseModel):
    job: str
    enqueued: int
    without_content: int


def version_number(version: str) -> int | None:
    found = _VERSION.search(version)
    return int(found.group(1)) if found else None


def chosen(
    store: Neo4jGraphStore, user_id: str | None, *, only_degraded: bool, older_than: str | None
) -> Iterator[dict[str, Any]]:
    limit = None
    if older_than is not None:
        limit = version_number(older_than)
        if limit is None:
            raise QueryRejected("takes a prompt version such as extraction@v2", "extraction_older_than")
    for row in store.episodes_to_reextract(user_id):
        if only_degraded and row["extraction"] != "degraded":
            continue
        if limit is not None and (version_number(row["prompt_version"]) or 0) >= limit:
            continue
        yield row


def messages_of(content: str) -> list[Message]:
    """The messages of a stored episode's content (`role: text` lines; a line that starts like a role inside
    a message splits it, as for `memctl reindex`). Content of no such lines is one message of the user."""
    spans = spans_from_content(content)
    head = content[: spans[0][0]] if spans else ""
    messages = [Message(role="user", content=head.rstrip("\n"))] if head.strip() else []  # text before any role
    for start, end in spans:
        role, _, text = content[start:end].partition(": ")
        if role not in ROLES:  # not `role: text` lines (an imported text): the whole text as the user's
            return [Message(role="user", content=content)] if content.strip() else []
        if text.strip():
            messages.append(Message(role=role, content=text))
    return messages


def episode_of(row: dict[str, Any]) -> Episode:
    """The stored episode as the extract stage takes it (its messages from its content)."""
    return Episode(
        id=row["id"],
        user_id=row["user_id"],
        session_id=row["session_id"],
        messages=tuple(messages_of(row["content"])),
        occurred_at=row["occurred_at"],
    )


def plan(settings: Settings, rows: Iterator[dict[str, Any]]) -> ReextractPlan:
    """What a run would take (the dry run): no message is sent, no model is called."""
    from worker.extraction import extraction_prompt
    from worker.prompts import extraction as prompt

    offline = settings.llm_model == OFFLINE
    template = extraction_prompt(settings)
    counter: Callable[..., int] | None = None
    if not offline:
        from worker.llm.client import litellm_module

        counter = litellm_module().token_counter
    episodes = without = calls = prompt_tokens = completion_tokens = 0
    for row in rows:
        if not row["content"]:
            without += 1
            continue
        episodes += 1
        if counter is None:
            continue
        windows = plan_windows(messages_of(row["content"]), [], settings, template)  # one call each
        asked = 0
        for window in windows:
            messages = prompt.build_messages(template, window.new, context=window.context, schema_in_prompt=True)
            asked += int(counter(model=settings.llm_model, messages=messages))
        calls, prompt_tokens = calls + len(windows), prompt_tokens + asked
        # what its last LLM extraction answered, else a share of what it is asked
        completion_tokens += int(row["completion_tokens"]) or round(asked * COMPLETION_SHARE)
    return ReextractPlan(
        episodes=episodes,
        without_content=without,
        llm_calls=calls,
        prompt_tokens=prompt_tokens,
        completion_tokens_estimated=completion_tokens,
        estimated_cost_usd=0.0 if offline else _cost(settings.llm_model, prompt_tokens, completion_tokens),
        model=settings.llm_model,
    )


def _cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    from worker.llm.client import litellm_module

    try:
        prompt_cost, completion_cost = litellm_module().cost_per_token(
            model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
    except Exception:  # not in the price map
        return None
    return round(float(prompt_cost) + float(completion_cost), 6)


def enqueue(
    client: Any, rows: Iterator[dict[str, Any]], *, advance: Callable[[int], None] = lambda _n: None
) -> ReextractReport:
    """Send each chosen episode with content through the queue (waiting while the queue is full)."""
    job = uuid.uuid4().hex
    enqueued = without = 0
    for row in rows:
        if not row["content"]:
            without += 1
            continue
        payload = {**episode_payload(episode_of(row)), "reextract": job}
        deadline = time.monotonic() + QUEUE_FULL_WAIT_S
        while True:
            try:
                client.enqueue_payload(payload)
                break
            except QueueFull:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        enqueued += 1
        advance(1)
    if enqueued == 0 and without:
        raise QueryRejected(
            f"the {without} chosen episodes were stored without content (MEMORY_STORE_CONTENT=false): "
            "there is nothing to extract them from",
            "episodes",
        )
    return ReextractReport(job=job, enqueued=enqueued, without_content=without)
