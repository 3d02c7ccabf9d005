"""Time words in a recall query → the period the user asks about ("in May 2023", "on 3 June", "last week",
"上个月"), so that recall can favour the episodes that happened then (their `occurred_at`).

Pure functions, no I/O: `now` is passed in. A period is widened by LAG after its end, because people talk
about an event a few days after it happened ("on 25 May" is often told on the 27th).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

LAG = timedelta(days=10)
MIN_YEAR, MAX_YEAR = 1900, 2100  # outside these a number is not a date anyone asks memory about

_MONTHS = {name: i for i, name in enumerate(calendar.month_name) if name} | {
    name: i for i, name in enumerate(calendar.month_abbr) if name
}
_MONTH = "(" + "|".join(sorted((m for m in _MONTHS if m), key=len, reverse=True)) + r")\.?"
_YEAR = r"((?:19|20)\d\d)"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"

# Each pattern names the parts it captures, in order: d(ay), m(onth name), y(ear), n (month number).
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b", re.I), "dmy"),
    (re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.I), "mdy"),
    (re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.I), "my"),
    (re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]"), "ynd"),
    (re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月"), "yn"),
    (re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b"), "ynd"),
    (re.compile(rf"\b(?:in|during|since)\s+{_YEAR}\b", re.I), "y"),
    (re.compile(r"(\d{4})\s*年"), "y"),
)

_RELATIVE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\byesterday\b|昨天", re.I), "yesterday"),
    (re.compile(r"\btoday\b|今天", re.I), "today"),
    (re.compile(r"\blast\s+week\b|上周|上个星期|上星期", re.I), "last_week"),
    (re.compile(r"\blast\s+month\b|上个月|上月", re.I), "last_month"),
    (re.compile(r"\blast\s+year\b|去年", re.I), "last_year"),
    (re.compile(r"\bthis\s+week\b|这周|本周", re.I), "this_week"),
    (re.compile(r"\bthis\s+month\b|这个月|本月", re.I), "this_month"),
)
_AGO = re.compile(r"\b(\d{1,3})\s+(day|week|month)s?\s+ago\b|(\d{1,3})\s*(天|周|个月)前", re.I)


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime  # exclusive, LAG included
    text: str  # the words of the query that named it


def _day(y: int, m: int, d: int) -> tuple[datetime, datetime] | None:
    try:
        start = datetime(y, m, d, tzinfo=UTC)
    except ValueError:
        return None
    return start, start + timedelta(days=1)


def _month(y: int, m: int) -> tuple[datetime, datetime] | None:
    if not 1 <= m <= 12:
        return None
    start = datetime(y, m, 1, tzinfo=UTC)
    return start, start + timedelta(days=calendar.monthrange(y, m)[1])


def _absolute(match: re.Match[str], parts: str) -> tuple[datetime, datetime] | None:
    got = dict(zip(parts, match.groups(), strict=True))
    year = int(got["y"])
    if not MIN_YEAR <= year <= MAX_YEAR:
        return None
    month = _MONTHS[got["m"].rstrip(".").capitalize()] if "m" in got else int(got.get("n", 0))
    if "d" in got:
        return _day(year, month, int(got["d"]))
    if month:
        return _month(year, month)
    return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)


def _relative(kind: str, now: datetime) -> tuple[datetime, datetime]:
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    monday = today - timedelta(days=today.weekday())
    first = today.replace(day=1)
    if kind == "yesterday":
        return today - timedelta(days=1), today
    if kind == "today":
        return today, today + timedelta(days=1)
    if kind == "last_week":
        return monday - timedelta(days=7), monday
    if kind == "this_week":
        return monday, today + timedelta(days=1)
    if kind == "last_month":
        previous = (first - timedelta(days=1)).replace(day=1)
        return previous, first
    if kind == "this_month":
        return first, today + timedelta(days=1)
    return today.replace(year=today.year - 1, month=1, day=1), first.replace(month=1)


def _ago(match: re.Match[str], now: datetime) -> tuple[datetime, datetime]:
    count = int(match.group(1) or match.group(3))
    unit = (match.group(2) or match.group(4)).lower()
    days = {"day": 1, "天": 1, "week": 7, "周": 7, "month": 30, "个月": 30}[unit] * count
    centre = now - timedelta(days=days)
    slack = timedelta(days=max(1, days // 4))
    return centre - slack, centre + slack


def period_in(query: str, now: datetime) -> Period | None:
    """The first (most specific) period the query names, or None. Absolute dates win over relative words."""
    for pattern, parts in _PATTERNS:
        match = pattern.search(query)
        if match:
            span = _absolute(match, parts)
            if span is not None:
                return Period(span[0], span[1] + LAG, match.group(0))
    try:  # relative to a time at the calendar's ends (an `as_of` of year 1 or 9999), a period may not exist
        match = _AGO.search(query)
        if match:
            start, end = _ago(match, now)
            return Period(start, end, match.group(0))
        for pattern, kind in _RELATIVE:
            match = pattern.search(query)
            if match:
                start, end = _relative(kind, now)
                return Period(start, end + LAG, match.group(0))
    except (OverflowError, ValueError):
        return None
    return None
