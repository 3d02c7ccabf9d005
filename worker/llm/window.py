"""Conversations longer than the model's context window: extracted in windows of messages.

The model's input window comes from MEMORY_LLM_CONTEXT_TOKENS, else from litellm's model info (the smallest
of the primary and fallback models it knows). A model litellm does not know, with no setting, is sent the
whole conversation as before (a provider refusal is then a permanent failure: set the setting).

A window's budget is that window less the answer's room (MEMORY_LLM_MAX_TOKENS, twice: a malformed answer is
asked again with it and a correction), the prompt's own text (system text with the schema, headers) and a
margin; and the known facts offered to every window. Messages are counted once each with litellm's token
counter for the model; a conversation that fits is one window (no count at all when its UTF-8 bytes already
fit: a token is at least one byte). Otherwise messages go into windows in order, and each window after the
first is given the last OVERLAP messages before it as earlier context (understood, not extracted again; at
most a third of the budget). A
single message longer than a window is cut at character boundaries into parts that fit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from worker.models import Message
from worker.prompts import extraction as prompt
from worker.prompts.template import PromptTemplate
from worker.settings import Settings

log = logging.getLogger(__name__)

OVERLAP = 2  # messages of context a window after the first is given
MARGIN = 0.05  # of the budget, for counting the messages one by one rather than as one text
PER_MESSAGE = 4  # tokens of chat format around each message
REASK = 200  # tokens of the correction a re-ask adds (worker/extraction.py _reask_text)


@dataclass(frozen=True)
class Window:
    context: list[Message]
    new: list[Message]


def input_tokens(settings: Settings) -> int | None:
    """The input window of the models this deployment calls; None when unknown."""
    if settings.llm_context_tokens is not None:
        return settings.llm_context_tokens
    return _known_window((settings.llm_model, *settings.llm_fallback_models))


@lru_cache(maxsize=8)
def _known_window(models: tuple[str, ...]) -> int | None:
    from worker.llm.client import litellm_module

    litellm = litellm_module()
    known = []
    for model in models:
        try:
            info = litellm.get_model_info(model)
        except Exception:  # not in litellm's model map
            continue
        size = info.get("max_input_tokens") or info.get("max_tokens")
        if size:
            known.append(int(size))
    return min(known) if known else None


def token_counter(settings: Settings) -> Callable[[str], int]:
    from worker.llm.client import litellm_module

    litellm = litellm_module()
    return lambda text: int(litellm.token_counter(model=settings.llm_model, text=text)) + PER_MESSAGE


MIN_ROOM = 64  # tokens for messages in a window, below which no conversation can be extracted


def room_for_messages(window: int, max_tokens: int, overhead: int = 0) -> int:
    """Tokens left for messages in a window: the answer, and a re-ask of a malformed one (the answer again
    plus the correction), and the prompt's own `overhead` taken out."""
    return int((window - 2 * max_tokens - REASK - overhead) * (1 - MARGIN))


def plan_windows(
    conversation: Sequence[Message],
    context: Sequence[Message],
    settings: Settings,
    template: PromptTemplate,
    count: Callable[[str], int] | None = None,
    known: str = "",
) -> list[Window]:
    """The windows to extract the conversation in (one when it fits, or when the window is unknown). `known`:
    the block of known facts every window's prompt carries (worker/known_facts.py)."""
    window = input_tokens(settings)
    whole = [Window(list(context), list(conversation))]
    if window is None:
        return whole
    count = cache(count or token_counter(settings))  # each message counted once, however often it is placed
    overhead = _overhead(template, settings.llm_model, count) + (count(known) if known else 0)
    budget = room_for_messages(window, settings.llm_max_tokens, overhead)
    if budget < MIN_ROOM:
        raise ValueError(
            f"the model's window ({window} tokens) leaves no room for messages after the prompt ({overhead}) and "
            f"the answer ({settings.llm_max_tokens}): lower MEMORY_LLM_MAX_TOKENS or raise MEMORY_LLM_CONTEXT_TOKENS"
        )
    if sum(len(_text(m).encode("utf-8")) + PER_MESSAGE for m in [*context, *conversation]) <= budget:
        return whole  # a token is at least one byte: it fits without counting
    parts = [piece for m in conversation for piece in _fitted(m, budget, count)]
    sizes = [count(_text(m)) for m in parts]
    if sum(sizes) + sum(count(_text(m)) for m in context) <= budget:
        return [Window(list(context), parts)]
    kept = _tail(list(context), budget // 3, count)  # the first window keeps the latest earlier context
    windows: list[Window] = []
    start = 0
    while start < len(parts):
        earlier = kept if start == 0 else _tail(parts[max(0, start - OVERLAP) : start], budget // 3, count)
        end, used = start, sum(count(_text(m)) for m in earlier)
        while end < len(parts) and used + sizes[end] <= budget:
            used += sizes[end]
            end += 1
        if end == start:  # the context leaves no room for the next part: it goes alone (it fits, _fitted)
            earlier, end = [], start + 1
        windows.append(Window(earlier, parts[start:end]))
        start = end
    log.info("conversation extracted in windows", extra={"windows": len(windows), "window_tokens": window})
    return windows


_OVERHEADS: dict[tuple[str, str], int] = {}


def _overhead(template: PromptTemplate, model: str, count: Callable[[str], int]) -> int:
    """Tokens of the prompt around the messages (system text with the schema, headers), once per process."""
    key = (template.version, model)
    if key not in _OVERHEADS:
        frame = prompt.build_messages(template, [], context=[], schema_in_prompt=True)
        _OVERHEADS[key] = sum(count(m["content"]) for m in frame) + count("Earlier context (already extracted):\n")
    return _OVERHEADS[key]


def _text(message: Message) -> str:
    return f"{message.role}: {message.content}"


def _tail(messages: list[Message], room: int, count: Callable[[str], int]) -> list[Message]:
    """The latest messages that fit in room tokens."""
    kept: list[Message] = []
    for message in reversed(messages):
        size = count(_text(message))
        if size > room:
            break
        kept.insert(0, message)
        room -= size
    return kept


def _fitted(message: Message, budget: int, count: Callable[[str], int]) -> list[Message]:
    """The message, or its parts cut at character boundaries, each of at most budget tokens."""
    size = count(_text(message))
    if size <= budget or len(message.content) <= 1:
        return [message]
    pieces = -(-size // budget) + 1  # a piece of chars / pieces characters is about size / pieces tokens
    step = -(-len(message.content) // pieces)
    out: list[Message] = []
    for start in range(0, len(message.content), step):
        piece = message.content[start : start + step]
        if piece.strip():
            out.extend(_fitted(Message(role=message.role, content=piece), budget, count))
    return out
