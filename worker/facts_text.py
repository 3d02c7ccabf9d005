"""How a fact's predicate and date are written down: the normal forms the graph keys and compares on."""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, date, datetime

DEFAULT_PREDICATE = "related_to"  # also what relationships stored before predicates existed become
_NOT_WORD = re.compile(r"[^\w]+")
_DATE = re.compile(r"^(\d{4})(?:-(\d{1,2})(?:-(\d{1,2}))?)?")


def normalize_predicate(text: str) -> str:
    """Free text → snake_case (NFKC, case-folded, anything but letters and digits one underscore), at most 64
    characters; nothing left → related_to. "Lives in" and "LIVES_IN" are one predicate."""
    words = _NOT_WORD.sub("_", unicodedata.normalize("NFKC", text).casefold()).strip("_")
    return words[:64].rstrip("_") or DEFAULT_PREDICATE


def fact_date(text: str) -> str:
    """A model's date → YYYY-MM-DD (a year alone: its first day; a month: its first day); anything else,
    or an impossible date, → "" (the fact then dates from its episode: a bad date never costs the fact)."""
    found = _DATE.match(text.strip())
    if not found:
        return ""
    year, month, day = int(found[1]), int(found[2] or 1), int(found[3] or 1)
    try:
        return date(year, month, day).isoformat()
    except ValueError:
        return ""


def fact_time(text: str) -> datetime | None:
    """The UTC midnight a normalised date stands for; None for ""."""
    if not text:
        return None
    return datetime.combine(date.fromisoformat(text), datetime.min.time(), tzinfo=UTC)
