"""Conversation → ExtractionResult: the offline extractor or an LLM, one re-ask on a malformed answer,
and a degraded result (never an exception) when the answer stays malformed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from worker.llm.answer import Dropped, parse_answer, parse_extraction
from worker.llm.client import LLMClient, LLMUsage
from worker.models import ExtractionKind, ExtractionResult, Message
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
) -> Extraction:
    """LLM call failures raise LLMError (the task layer retries); a malformed answer never raises."""
    template = extraction_prompt(settings)
    if settings.llm_model == OFFLINE:
        result = parse_answer(extract_offline(conversation), prompt.ResponseModel)
        return Extraction(result, "offline", OFFLINE, template.version, LLMUsage())

    client = llm or LLMClient(settings)

    def messages_for(schema_in_prompt: bool) -> list[dict[str, str]]:
        return prompt.build_messages(template, conversation, context=context, schema_in_prompt=schema_in_prompt)

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
