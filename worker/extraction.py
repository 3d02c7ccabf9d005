"""Conversation → ExtractionResult: the offline extractor or an LLM, one re-ask on a malformed answer,
and a degraded result (never an exception) when the answer stays malformed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from worker.identity import entity_key
from worker.known_facts import KnownFact, known_facts_text
from worker.llm.answer import Dropped, parse_answer, parse_extraction
from worker.llm.client import LLMClient, LLMUsage
from worker.llm.window import plan_windows
from worker.models import Entity, ExtractionKind, ExtractionResult, Message, Relationship
from worker.offline import MODEL_NAME as OFFLINE
from worker.offline import extract_offline, summarize_messages
from worker.prompts import extraction as prompt
from worker.prompts.template import PromptTemplate
from worker.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Extraction:
    result: ExtractionResult
    kind: ExtractionKind
    model: str
    prompt_version: str
    usage: LLMUsage
    dropped: Dropped = field(default_factory=Dropped)  # items of the answer left out by validation
    windows: int = 1  # LLM windows the conversation was extracted in (worker/llm/window.py)


def extraction_prompt(settings: Settings) -> PromptTemplate:
    return PromptTemplate.load(prompt.DEFAULT, settings.prompt_extraction_file)


def _reask_text(error: ValidationError) -> str:
    problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'answer'}: {e['msg']}" for e in error.errors()[:10])
    return (
        f"Your answer could not be used ({problems}). Answer again with one JSON object only, "
        "exactly in the requested shape."
    )


def extract(
    conversation: Sequence[Message],
    *,
    settings: Settings,
    llm: LLMClient | None = None,
    context: Sequence[Message] = (),
    episode_id: str = "",
    known: Sequence[KnownFact] = (),
) -> Extraction:
    """LLM call failures raise LLMError (the task layer retries); a malformed answer never raises. `known`:
    facts offered to the model with their ids (the offline extractor ignores them: it never ends a fact)."""
    template = extraction_prompt(settings)
    if settings.llm_model == OFFLINE:
        result = parse_answer(extract_offline(conversation), prompt.ResponseModel)
        return Extraction(result, "offline", OFFLINE, template.version, LLMUsage())

    client = llm or LLMClient(settings)
    offered = known_facts_text(known)
    windows = plan_windows(conversation, context, settings, template, known=offered)
    parts = [_extract_window(client, template, w.new, w.context, episode_id, offered) for w in windows]
    return parts[0] if len(parts) == 1 else merged(parts)


def _extract_window(
    client: LLMClient,
    template: PromptTemplate,
    conversation: Sequence[Message],
    context: Sequence[Message],
    episode_id: str,
    known: str,
) -> Extraction:
    """One LLM call (and one re-ask on a malformed answer) for messages that fit the model's window."""

    def messages_for(schema_in_prompt: bool) -> list[dict[str, str]]:
        return prompt.build_messages(
            template, conversation, context=context, schema_in_prompt=schema_in_prompt, known=known
        )

    reply = client.complete(messages_for, prompt.ResponseModel)
    usage = reply.usage
    try:
        result, dropped = parse_extraction(reply.text)
        return Extraction(result, "llm", reply.model, template.version, usage, dropped)
    except ValidationError as first:
        log.warning("malformed extraction; asking again", extra={"episode_id": episode_id, "model": reply.model})
        correction = [{"role": "assistant", "content": reply.text}, {"role": "user", "content": _reask_text(first)}]
        again = client.complete(lambda s: reply.messages + correction, prompt.ResponseModel, only_model=reply.model)
        usage = usage + again.usage
        try:
            result, dropped = parse_extraction(again.text, lenient=True)  # what is valid, rather than nothing
            return Extraction(result, "llm", again.model, template.version, usage, dropped)
        except ValidationError:
            log.warning("extraction stays malformed; keeping it degraded", extra={"episode_id": episode_id})
    degraded = ExtractionResult(summary=summarize_messages(conversation)[:10_000])
    return Extraction(degraded, "degraded", reply.model, template.version, usage)


def _joined(known: Relationship, new: Relationship, weight: float) -> Relationship:
    return known.model_copy(
        update={
            "weight": min(weight, 1_000_000.0),
            "description": new.description or known.description,
            "valid_from": min(filter(None, (known.valid_from, new.valid_from)), default=""),  # the earliest date
            "ends": list(dict.fromkeys([*known.ends, *new.ends])),
        }
    )


def merged(parts: Sequence[Extraction]) -> Extraction:
    """One extraction of a conversation extracted in windows: entities merged on their key (first name and
    type given, latest description), relationships on their ends and predicate (within a window their weights add up, as
    saving adds them; across windows the strongest weight; latest description),
    the window summaries in order as one summary; degraded when any window was. Usage and drops add up."""
    entities: dict[str, Entity] = {}
    for part in parts:
        for entity in part.result.entities:
            key = entity_key(entity.name)
            known = entities.get(key)
            if known is None:
                entities[key] = entity
                continue
            entities[key] = known.model_copy(
                update={
                    "type": known.type if known.type != "other" else entity.type,
                    "description": entity.description or known.description,
                }
            )
    relationships: dict[tuple[str, str, str], Relationship] = {}
    for part in parts:
        within: dict[tuple[str, str, str], Relationship] = {}  # one answer's repeats add up, as saving does
        for rel in part.result.relationships:
            ends = (entity_key(rel.source), rel.predicate, entity_key(rel.target))
            seen = within.get(ends)
            within[ends] = rel if seen is None else _joined(seen, rel, seen.weight + rel.weight)
        for ends, rel in within.items():  # the same fact in two windows (their overlap): the strongest
            known_rel = relationships.get(ends)
            relationships[ends] = (
                rel if known_rel is None else _joined(known_rel, rel, max(known_rel.weight, rel.weight))
            )
    summary = " ".join(dict.fromkeys(p.result.summary.strip() for p in parts if p.result.summary.strip()))
    result = ExtractionResult(
        summary=summary[:10_000],
        entities=list(entities.values())[:500],
        relationships=list(relationships.values())[:1000],
        ends=list(dict.fromkeys(i for p in parts for i in p.result.ends))[:50],
    )
    usage = parts[0].usage
    for part in parts[1:]:
        usage = usage + part.usage
    dropped = Dropped(
        entities=sum(p.dropped.entities for p in parts), relationships=sum(p.dropped.relationships for p in parts)
    )
    kind: ExtractionKind = "degraded" if any(p.kind == "degraded" for p in parts) else "llm"
    return Extraction(result, kind, parts[-1].model, parts[0].prompt_version, usage, dropped, windows=len(parts))
