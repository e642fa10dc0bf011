"""Session and time awareness for recall: which messages a question's time words point at.

Theory of operation. A message's date is read from its indexed context (a context
mapping's ``"date"``, such as ``"1:56 pm on 8 May, 2023"``: the first full date in it,
written day-month-year, month-day-year or year-month-day). :func:`span` reads the time a
question names, as a range of days:

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

Dates a message carries. :func:`moment` reads the value of a message's metadata field (a
``timestamp``, a ``created_at``) into a :class:`Moment`, whatever its spelling: a
``datetime`` or ``date``, ISO 8601 (``"2023-05-08T13:56:00Z"``, ``"2023-05-08"``,
``"20230508T135600"``), epoch seconds, milliseconds, microseconds or nanoseconds (a
number, or a string of digits), a datetime's ``repr`` (what a serializer that does not
know datetimes writes), or words (``"1:56 pm on 8 May, 2023"``, ``"Mon, 08 May 2023
13:56:00 +0000"``, ``"May 8th, 2023 at 1:56 PM"``, ``"08.05.2023"``, ``"5/8/2023"``). A
time zone is not converted: the wall-clock time written is the one kept (epoch values are
read in UTC). Slashed numeric dates are read month first unless the first number cannot
be a month (``"25/5/2023"``); dotted ones day first. A value without a day (``"May
2023"``) is no date. :func:`spelled` writes a moment the one way :func:`message_date` reads
and a question's words match (``"1:56 pm on 8 May, 2023"``), so a message's date is
indexed the same whatever spelling it came in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from typing import NamedTuple

__all__ = [
    "SLACK",
    "Moment",
    "Span",
    "clock",
    "message_date",
    "moment",
    "newest",
    "span",
    "spelled",
    "within",
]

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
# Dates as written in values and contexts (month names may be abbreviated there, never in
# a question: "in Jan" may be a person).
_MW = r"(jan|feb|mar|apr|may|jun|jul|aug|sept?|oct|nov|dec)[a-z]*\.?"
_WDMY = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?(?:\s+of)?[\s-]+{_MW},?[\s-]+(\d{{4}})\b", re.I)
_WMDY = re.compile(rf"\b{_MW}\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I)
_YMD = re.compile(r"(?<![\d.])(\d{4})([-/.])(\d{1,2})\2(\d{1,2})(?![\d])")
_XYZ = re.compile(r"(?<![\d.:/])(\d{1,2})([/.])(\d{1,2})\2(\d{4})(?![\d])")
_CLOCK = re.compile(
    r"(?<![\d:])(\d{1,2})(?::(\d{2}))?(?::\d{2}(?:\.\d+)?)?\s*([ap])\.?\s?m\b\.?"
    r"|(?<![\d:])(\d{1,2}):(\d{2})(?![\d])",
    re.I,
)
_REPR = re.compile(
    r"\b(?:datetime|date)\((\d{4}),\s*(\d{1,2}),\s*(\d{1,2})(?:,\s*(\d{1,2}),\s*(\d{1,2}))?"
)
_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
_MONTH_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
# Epoch values by size: seconds, milliseconds, microseconds, nanoseconds since 1970, each
# read as a date between 1973 and 2103 (a smaller number is not taken for a date).
_EPOCHS = ((1e8, 1.0), (1e11, 1e3), (1e14, 1e6), (1e17, 1e9))
_LONGEST = 200

Span = tuple[date, date]
# A date pattern and the numbers of its year, month and day groups.
_Form = tuple[re.Pattern[str], tuple[int, int, int]]


class Moment(NamedTuple):
    """A message's date and, when its value gave one, its wall-clock time."""

    day: date
    clock: time | None = None


def _day(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def _month(year: int, month: int) -> Span:
    first = date(year, month, 1)
    last = (date(year + (month == 12), month % 12 + 1, 1)) - timedelta(days=1)
    return first, last


def _dates(text: str, forms: Iterable[_Form]) -> list[tuple[int, date]]:
    """Each valid date of ``forms`` in ``text``, with where it starts."""
    found: list[tuple[int, date]] = []
    for pattern, (y, m, d) in forms:
        for match in pattern.finditer(text):
            month = match.group(m)
            number = int(month) if month.isdigit() else _MONTHS[month.lower()[:3]]
            day = _day(int(match.group(y)), number, int(match.group(d)))
            if day:
                found.append((match.start(), day))
    return found


def _absolute(text: str) -> tuple[date | None, int]:
    """The first full date a question names and where it starts (``-1``: none)."""
    found = _dates(text, ((_DMY, (3, 2, 1)), (_MDY, (3, 1, 2))))
    if not found:
        return None, -1
    start, day = min(found)
    return day, start


def _written(text: str) -> date | None:
    """The first full date written in ``text``, in any form of the module docstring."""
    found = _dates(text, ((_WDMY, (3, 2, 1)), (_WMDY, (3, 1, 2)), (_YMD, (1, 3, 4))))
    for match in _XYZ.finditer(text):
        a, b, year = int(match.group(1)), int(match.group(3)), int(match.group(4))
        month_first = match.group(2) == "/" and a <= 12
        day = _day(year, a, b) if month_first else _day(year, b, a)
        if day:
            found.append((match.start(), day))
    return min(found)[1] if found else None


def message_date(context: str) -> date | None:
    """The date in a message's context string (``None`` when it names none)."""
    return _written(context) if context else None


def clock(value: str) -> time | None:
    """The wall-clock time written in ``value`` (``"1:56 pm"``, ``"13:56"``), or ``None``."""
    match = _CLOCK.search(value[:_LONGEST])
    if match is None:
        return None
    if match.group(3):
        hour, minute = int(match.group(1)), int(match.group(2) or 0)
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + 12 * (match.group(3).lower() == "p")
    else:
        hour, minute = int(match.group(4)), int(match.group(5))
    return time(hour, minute) if hour < 24 and minute < 60 else None


def _epoch(number: float) -> Moment | None:
    if not math.isfinite(number):
        return None
    for low, per_second in reversed(_EPOCHS):
        if low <= number < low * 42:
            try:
                at = datetime.fromtimestamp(number / per_second, UTC)
            except (OverflowError, OSError, ValueError):
                return None
            return Moment(at.date(), at.time().replace(second=0, microsecond=0))
    return None


def _iso(text: str) -> Moment | None:
    try:
        return Moment(date.fromisoformat(text))
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return Moment(at.date(), at.time().replace(second=0, microsecond=0))


def moment(value: object) -> Moment | None:
    """The date (and time) a metadata value spells, or ``None`` (see the module docstring).

    Args:
        value: A string, an int or a float (epoch seconds, milliseconds, microseconds or
            nanoseconds), a ``datetime`` or a ``date``; anything else (``bool`` included)
            is ``None``.
    """
    if isinstance(value, datetime):
        return Moment(value.date(), value.time().replace(second=0, microsecond=0))
    if isinstance(value, date):
        return Moment(value)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if not isinstance(value, str):
        return _epoch(float(max(-1, min(value, 1 << 64))))  # an int of any size
    text = value.strip()[:_LONGEST]
    if _NUMBER.fullmatch(text):
        return _epoch(float(text)) or _iso(text)
    found = _iso(text)
    if found is not None:
        return found
    match = _REPR.search(text)
    if match:
        year, month, number, hour, minute = match.groups()
        day = _day(int(year), int(month), int(number))
        at = None if hour is None else (int(hour), int(minute))
        if day and (at is None or (at[0] < 24 and at[1] < 60)):
            return Moment(day, None if at is None else time(*at))
    day = _written(text)
    return Moment(day, clock(text)) if day else None


def spelled(found: Moment) -> str:
    """``found`` written as LoCoMo writes dates: ``"1:56 pm on 8 May, 2023"``, or the day."""
    day = f"{found.day.day} {_MONTH_NAMES[found.day.month - 1]}, {found.day.year}"
    if found.clock is None:
        return day
    hour = found.clock.hour % 12 or 12
    half = "am" if found.clock.hour < 12 else "pm"
    return f"{hour}:{found.clock.minute:02d} {half} on {day}"


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
