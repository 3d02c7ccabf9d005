"""The passage a recall hit shows: its best search window, cut to a bounded length around the query's terms."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from worker.terms import terms

MAX_PASSAGE_CHARS = 400
_LEAD = 120  # characters kept before the first matched word
_WORD = re.compile(r"\w+(?:['’]\w+)*")


@lru_cache(maxsize=65_536)
def _word_terms(word: str) -> tuple[str, ...]:
    return tuple(terms(word))  # words repeat across passages: analyse each once


def snippet(text: str, words: Sequence[str], max_chars: int = MAX_PASSAGE_CHARS) -> str:
    """`text` when it is short enough; else the max_chars around the region densest in query terms."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    wanted = set(words)
    hits = [m.start() for m in _WORD.finditer(text) if wanted.intersection(_word_terms(m.group(0)))]
    start = 0
    if hits:
        # the start that covers the most matched words within max_chars
        best = max(hits, key=lambda h: sum(1 for x in hits if h <= x < h + max_chars - _LEAD))
        start = max(0, best - _LEAD)
        space = text.rfind(" ", 0, start + 1)
        start = space + 1 if space > 0 and start - space < 20 else start
    end = min(len(text), start + max_chars)
    cut = text[start:end].strip()
    return ("…" if start > 0 else "") + cut + ("…" if end < len(text) else "")
