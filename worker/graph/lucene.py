"""Build Lucene query strings from user text so that nothing in it acts as query syntax."""

from __future__ import annotations

import re
from collections.abc import Sequence

from worker.stopwords import ENGLISH_STOP

_SPECIAL = frozenset('+-&|!(){}[]^"~*?:\\/')
_OPERATORS = re.compile(r"\b(AND|OR|NOT|TO)\b")
_HAS_WORD = re.compile(r"\w")
_NOT_WORD = re.compile(r"\W+")
# Characters the cjk analyzer indexes as overlapping bigrams (Han, kana, Hangul): about one term each.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002ffff"
_ANALYSED_TERM = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+")
# Terms of free text in one query: each becomes a clause per field of the index (three for entities), next to
# up to 32 keyword phrases, all under Lucene's limit of 1,024 clauses.
MAX_TEXT_TERMS = 200
# Unique terms one query searches: a conversation pasted as the query keeps every term up to this (Lucene's
# limit is 1,024 clauses in all); past it worker/graph/candidates.py keeps the latest, nearest to the question.
MAX_QUERY_TERMS = 256


def content_terms(text: str) -> str:
    """The text without English function words ("what", "my", "I" ...), which would otherwise match almost
    every episode and entity description; the text as it is when nothing else is left."""
    kept = [tok for tok in text.split() if _NOT_WORD.sub("", tok.lower()) not in ENGLISH_STOP]
    return " ".join(kept) if any(_HAS_WORD.search(t) for t in kept) else text


def within_terms(text: str, max_terms: int = MAX_TEXT_TERMS) -> str:
    """The text cut after its max_terms-th analysed term. Text without spaces (Chinese, Japanese) is one word
    but a term per character to the analyzer, so a character cut alone cannot bound the clauses."""
    for count, match in enumerate(_ANALYSED_TERM.finditer(text), 1):
        if count == max_terms:
            return text[: match.end()]
    return text


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

    The text is cut to max_text_chars and MAX_TEXT_TERMS terms so that a long query cannot exceed Lucene's
    clause limit.
    """
    clauses = [phrase(k) + "^2" for k in keywords if _HAS_WORD.search(k)][:max_keywords]
    cut = within_terms(content_terms(text)[:max_text_chars])
    if _HAS_WORD.search(cut):
        clauses.append(escape_text(cut))
    if not clauses:
        return None
    return f"+user_tag:{user_tag} +({' '.join(clauses)})"


def terms_query(user_tag: str, words: Sequence[str], *, max_terms: int = MAX_QUERY_TERMS) -> str | None:
    """`+user_tag:<tag> +(<term> ...)` over already analysed terms (worker/terms.py), or None when there are
    none. Terms hold only letters and digits; they are escaped all the same."""
    unique = list(dict.fromkeys(w for w in words if _HAS_WORD.search(w)))[:max_terms]
    if not unique:
        return None
    return f"+user_tag:{user_tag} +({' '.join(escape_text(w) for w in unique)})"
