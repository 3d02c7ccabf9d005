"""Build Lucene query strings from user text so that nothing in it acts as query syntax."""

from __future__ import annotations

import re
from collections.abc import Sequence

from worker.stopwords import ENGLISH_STOP

_SPECIAL = frozenset('+-&|!(){}[]^"~*?:\\/')
_OPERATORS = re.compile(r"\b(AND|OR|NOT|TO)\b")
_HAS_WORD = re.compile(r"\w")
_NOT_WORD = re.compile(r"\W+")


def content_terms(text: str) -> str:
    """The text without English function words ("what", "my", "I" ...), which would otherwise match almost
    every episode and entity description; the text as it is when nothing else is left."""
    kept = [tok for tok in text.split() if _NOT_WORD.sub("", tok.lower()) not in ENGLISH_STOP]
    return " ".join(kept) if any(_HAS_WORD.search(t) for t in kept) else text


def escape_text(text: str) -> str:
    """Free text → terms: every syntax character escaped and operator words lower-cased (the analyzer
    lower-cases anyway), so `a AND b*` searches for the words a, and, b."""
    escaped = "".join("\\" + ch if ch in _SPECIAL else ch for ch in text)
    return _OPERATORS.sub(lambda m: m.group(0).lower(), escaped)


def phrase(text: str) -> str:
    """A keyword → one quoted phrase; inside quotes only backslash and quote need escaping."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def build_query(
    user_tag: str, keywords: Sequence[str], text: str, *, max_keywords: int = 32, max_text_chars: int = 200
) -> str | None:
    """`+user_tag:<tag> +(<keyword phrases, boosted> <text terms>)`, or None when nothing is searchable.

    The text is cut to max_text_chars so that a long query cannot exceed Lucene's clause limit.
    """
    clauses = [phrase(k) + "^2" for k in keywords if _HAS_WORD.search(k)][:max_keywords]
    cut = content_terms(text)[:max_text_chars]
    if _HAS_WORD.search(cut):
        clauses.append(escape_text(cut))
    if not clauses:
        return None
    return f"+user_tag:{user_tag} +({' '.join(clauses)})"


def terms_query(user_tag: str, words: Sequence[str], *, max_terms: int = 64) -> str | None:
    """`+user_tag:<tag> +(<term> ...)` over already analysed terms (worker/terms.py), or None when there are
    none. Terms hold only letters and digits; they are escaped all the same."""
    unique = list(dict.fromkeys(w for w in words if _HAS_WORD.search(w)))[:max_terms]
    if not unique:
        return None
    return f"+user_tag:{user_tag} +({' '.join(escape_text(w) for w in unique)})"
