"""Session and time awareness for recall: which messages a question's time words point at.

Theory of operation. A message's date is read from its indexed context (a context
mapping's ``"date"``, such as ``"1:56 pm on 8 May, 2023"``: the first day-month-year or
month-day-year in it). :func:`span` reads the time a question names, as a range of days:

- absolute: ``"on 3 June, 2023"``, ``"October 13, 2023"`` (that day), ``"in July 2023"``
  (the month), ``"in 2022"`` (the year), ``"in June"`` or ``"during the summer"`` (that
  month or season, in the year of the newest message);
- relative to ``now`` (the newest date among the candidates: when the question is asked,
  in a chat that runs on): ``"yesterday"``, ``"last week"``, ``"last weekend"``, ``"last
  month"``, ``"last year"``, ``"last summer"`` (the most recent one before now), and
  ``"before <date>"`` (the ten days up to that date).

A message is *in* the span when its date falls inside it or up to :data:`SLACK` days
after it (people tell on Tuesday what they did at the weekend). The ranking
(:func:`demote.archive._rank.favour`) multiplies those messages' scores by
``1 + time_weight``. Pure: no I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import date, timedelta

__all__ = ["SLACK", "Span", "message_date", "newest", "span", "within"]

#: Days after a span that still count as in it: a message tells of what happened before.
SLACK = 10

_MONTHS = {
    m: n
    for n, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for m in names
}
_SEASONS = {
    "spring": (3, 5),
    "summer": (6, 8),
    "autumn": (9, 11),
    "fall": (9, 11),
    "winter": (12, 2),
}
_M = r"(january|february|march|april|may|june|july|august|september|october|november|december)"
_DMY = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+{_M},?\s+(\d{{4}})\b", re.I)
_MDY = re.compile(rf"\b{_M}\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I)
_MY = re.compile(rf"\b{_M},?\s+(\d{{4}})\b", re.I)
_MONTH = re.compile(rf"\b(?:in|during|of)\s+(?:the\s+month\s+of\s+)?{_M}\b", re.I)
_YEAR = re.compile(r"\b(?:in|during|of)\s+((?:19|20)\d{2})\b", re.I)
_SEASON = re.compile(r"\b(last\s+)?(spring|summer|autumn|fall|winter)\b", re.I)
_RELATIVE = re.compile(r"\b(yesterday|last\s+(?:week(?:end)?|month|year))\b", re.I)
_BEFORE = re.compile(r"\bbefore\b", re.I)

Span = tuple[date, date]


def _day(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def _month(year: int, month: int) -> Span:
    first = date(year, month, 1)
    last = (date(year + (month == 12), month % 12 + 1, 1)) - timedelta(days=1)
    return first, last


def _absolute(text: str) -> tuple[date | None, int]:
    """The first full date in ``text`` and where it starts (``-1``: none)."""
    found: list[tuple[int, date]] = []
    for match in _DMY.finditer(text):
        d = _day(int(match.group(3)), _MONTHS[match.group(2).lower()], int(match.group(1)))
        if d:
            found.append((match.start(), d))
    for match in _MDY.finditer(text):
        d = _day(int(match.group(3)), _MONTHS[match.group(1).lower()], int(match.group(2)))
        if d:
            found.append((match.start(), d))
    if not found:
        return None, -1
    start, d = min(found)
    return d, start


def message_date(context: str) -> date | None:
    """The date in a message's context string (``None`` when it names none)."""
    return _absolute(context)[0] if context else None


def newest(contexts: Iterable[str]) -> date | None:
    """The latest date among ``contexts``: the "now" relative time words count from."""
    dates = [d for d in (message_date(c) for c in contexts) if d is not None]
    return max(dates) if dates else None


def span(query: str, now: date | None) -> Span | None:
    """The range of days ``query`` names, or ``None`` when it names no time."""
    day, start = _absolute(query)
    if day is not None:
        if _BEFORE.search(query[:start]):
            return day - timedelta(days=10), day
        return day, day
    match = _MY.search(query)
    if match:
        return _month(int(match.group(2)), _MONTHS[match.group(1).lower()])
    match = _YEAR.search(query)
    if match:
        year = int(match.group(1))
        return date(year, 1, 1), date(year, 12, 31)
    if now is None:
        return None
    match = _MONTH.search(query)
    if match:
        return _month(now.year, _MONTHS[match.group(1).lower()])
    match = _RELATIVE.search(query)
    if match:
        word = " ".join(match.group(1).lower().split())
        if word == "yesterday":
            return now - timedelta(days=1), now - timedelta(days=1)
        if word in ("last week", "last weekend"):
            return now - timedelta(days=10), now
        if word == "last month":
            return _month(now.year - (now.month == 1), (now.month - 2) % 12 + 1)
        return date(now.year - 1, 1, 1), date(now.year - 1, 12, 31)
    match = _SEASON.search(query)
    if match:
        first, last = _SEASONS[match.group(2).lower()]

        def season(year: int) -> Span:  # winter runs from December of the year before
            begin = date(year - 1, 12, 1) if first > last else date(year, first, 1)
            return begin, _month(year, last)[1]

        found = season(now.year)
        if match.group(1) and found[1] >= now:  # "last summer": the latest one that ended
            found = season(now.year - 1)
        return found
    return None


def within(day: date | None, found: Span) -> bool:
    """Whether a message of ``day`` is in the span (up to :data:`SLACK` days after it)."""
    return day is not None and found[0] <= day <= found[1] + timedelta(days=SLACK)
