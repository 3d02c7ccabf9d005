"""The extraction prompt: conversation → summary, entities, relationships (ExtractionResult)."""

from __future__ import annotations

from collections.abc import Sequence

from worker.models import ExtractionResult, Message
from worker.prompts.template import PromptTemplate, system_text

ResponseModel = ExtractionResult

DEFAULT = PromptTemplate(
    version="extraction@v2",
    text="""You maintain the long-term memory of an AI assistant about one user.
Read the conversation and extract what is worth remembering about the user:
- summary: two or three sentences on what the user said (facts, preferences, plans, events), in the language
  of the conversation;
- entities: people, places, organizations, products, events and concepts the user talked about, each with a
  type (person, place, organization, product, event, concept or other) and a one-sentence description of
  what the conversation says about it; use names exactly as written; the user themself is the entity "user";
- relationships: how those entities relate: source, target, a predicate in snake_case (common ones:
  lives_in, works_at, studies_at, married_to, partner_of, parent_of, child_of, sister_of, brother_of,
  friend_of, owns, likes, dislikes, member_of, located_in, part_of, visited, plans_to), a short
  description, a weight from 0 to 1 for how strongly the conversation supports it, and valid_from: the date
  (YYYY-MM-DD) it became true when the conversation says so, else empty.
Known facts, when listed, are what the memory holds now, each with an id. When the new messages say one of
them is no longer true, put its id in `ends` of the relationship that replaces it (moved to another city: the
new lives_in ends the old one), or in the answer's `ends` when nothing replaces it. Only use the ids listed;
leave `ends` empty otherwise.
Messages marked as earlier context were extracted before: use them to understand the new messages, but
extract only what the new messages add. Do not invent anything that was not said.""",
)


def _render(messages: Sequence[Message]) -> str:
    return "\n".join(f"{m.role}: {m.content}" for m in messages)


def build_messages(
    template: PromptTemplate,
    conversation: Sequence[Message],
    *,
    context: Sequence[Message] = (),
    schema_in_prompt: bool = False,
    known: str = "",
) -> list[dict[str, str]]:
    """Chat messages for the extraction call. With schema_in_prompt (JSON mode), the schema is spelled out;
    `known`: the block of known facts (worker/known_facts.py), offered before the conversation."""
    system = system_text(template, ResponseModel, schema_in_prompt=schema_in_prompt)
    parts = [known] if known else []
    if context:
        parts.append("Earlier context (already extracted):\n" + _render(context))
    parts.append("New messages:\n" + _render(conversation))
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]
