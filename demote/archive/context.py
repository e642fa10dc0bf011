"""The context an archive indexes with a message by default: who said it, and when.

Both archives index, beside a message's text, a short *context* (see
:data:`~demote.archive.options.ContextFn`): its speaker favours the speaker a question names,
and its date is what time awareness and date words in a question match. Without a
``context=`` of the user's, the archives take it from the message itself:
:func:`message_context` is the default ``context=``.

Theory of operation. It reads the message's framework-neutral form (``DemotedMessage.data``,
made by the adapters' ``to_data``), so it serves LangChain, LlamaIndex and any hook's own
forms alike (a message built without that form has the same fields read from its ``raw``
object, by attribute). It looks in, best first:

1. the ``additional_kwargs`` the form keeps (LangChain's and LlamaIndex's), then
   LangChain's ``response_metadata``, then one level of mappings inside them (an
   ``additional_kwargs["metadata"]``; not a ``function_call``, tool or usage mapping, and
   a bare ``name`` only at the first level);
2. for the speaker, also the message's own ``name`` (LangChain), and last the role of a
   LangChain ``ChatMessage`` whose role is a name (``ChatMessage(role="Caroline")``).

Keys are compared lowercased with everything but letters and digits dropped, so
``created_at``, ``createdAt`` and ``Created-At`` are one key.

- The speaker is the first of :data:`SPEAKER_KEYS` found, then of any key naming a
  speaker, author or sender (``speaker_label``, ``message_author``; not an ``author_id``),
  that holds a name: a string with a letter, at most 80 characters, or a mapping's
  ``name`` (underscores read as spaces, as in the names OpenAI allows: ``Caroline_Smith``
  is favoured when a question names Caroline Smith). A tool result has none (its ``name``
  is the tool's).
- The date is the first value of :data:`DATE_KEYS`, then of any key naming a date or a
  time (``session_date``, ``message_timestamp``; not a ``duration`` or a ``timeout``),
  then any short value written as a date under another key (``"session": "8 May,
  2023"``; never a bare number, nor a model's or a version's name), that
  :func:`demote.archive._time.moment` reads: ISO 8601, epoch seconds or milliseconds, a
  datetime's ``repr``, LoCoMo's ``"1:56 pm on 8 May, 2023"`` and other written forms. A
  date without a time takes one from another such key that holds only a time (``"time":
  "13:56"``). It is indexed as LoCoMo writes it, ``"1:56 pm on 8 May, 2023"``, whatever
  its spelling, so the words of a question ("in May 2023") and time awareness find it
  the same way.

A ``context=`` of the user's replaces this one; to add to it, call it in yours::

    def context(message):
        found = message_context(message) or {}
        return {**found, "topic": topic_of(message)}
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import time
from enum import Enum
from typing import Any

from demote.archive import _time
from demote.records import ROLE_ALIASES, DemotedMessage

__all__ = ["DATE_KEYS", "SPEAKER_KEYS", "message_context"]

#: Keys read as the speaker, best first, as compared (lowercase letters and digits only).
SPEAKER_KEYS = (
    "speaker",
    "speakername",
    "author",
    "authorname",
    "sender",
    "sendername",
    "from",
    "displayname",
    "username",
    "user",
    "participant",
    "person",
    "persona",
    "character",
    "creator",
    "who",
    "name",
)
#: Keys read as the date, best first, as compared; after them any key naming a date or
#: a time (see the module docstring).
DATE_KEYS = (
    "timestamp",
    "datetime",
    "date",
    "createdat",
    "created",
    "sentat",
    "sent",
    "time",
    "ts",
    "when",
    "dt",
    "day",
    "postedat",
    "receivedat",
    "at",
)

_DATE_WORDS = re.compile(r"date|time|stamp")
_NOT_DATES = re.compile(r"duration|timeout|elapsed|latency|delta|zone|runtime|expir|ttl")
_SPEAKER_WORDS = re.compile(r"speaker|author|sender|username|displayname|nickname|fullname")
_NOT_NAMES = re.compile(r"(?:id|ids|type|kind|role|count|url|email|avatar|icon|image|colou?r)$")
#: A value under a key that names no date is read as one only when it is short, starts as
#: a date does (a digit, a month, a weekday) and is written as one (with a word, or ISO's
#: year first): never a bare number, never a name ("gpt-4o-2024-08-06"), never under a
#: key that names a model, a version, a name or an id.
_LONGEST_DATE = 40
_DAY_WORDS = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec|mon|tue|wed|thu|fri|sat|sun"
_WRITTEN_DATE = re.compile(
    rf"^\s*(?:\d{{4}}-\d{{1,2}}-\d{{1,2}}|\d.*[^\W\d_]|(?:{_DAY_WORDS})[a-z]*\b)", re.I
)
_NOT_FALLBACK = re.compile(r"model|version|fingerprint|name|id$|url|path|file")
_NOT_METADATA = re.compile(r"call|tool|function|usage|arg|input|output|param")
_NAME_FIELDS = ("name", "displayname", "username", "fullname")
_SOURCES = ("additional_kwargs", "response_metadata")
#: Role names that name no one (the core's, their aliases, LlamaIndex's own).
_ROLES = frozenset(ROLE_ALIASES) | {"chatbot", "model"}
#: Keys of one mapping looked at: metadata is small, a large mapping is something else.
_KEYS_READ = 64
_LONGEST_NAME = 80


def _key(name: object) -> str:
    return "".join(c for c in str(name).lower() if c.isalnum())


def _layer(found: Mapping[Any, Any]) -> dict[str, Any]:
    """``found``'s first keys by their compared form (the first of a form wins)."""
    out: dict[str, Any] = {}
    for n, (name, value) in enumerate(found.items()):
        if n >= _KEYS_READ:
            break
        out.setdefault(_key(name), value)
    return out


def _layers(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Where a message's metadata is, best first: the sources, then mappings inside them.

    A mapping that describes a call, a tool or usage (``function_call``: its ``name`` is
    the function's) is not metadata of the message.
    """
    extra = data.get("extra")
    if not isinstance(extra, Mapping):
        return [], []
    top = [_layer(m) for m in (extra.get(s) for s in _SOURCES) if isinstance(m, Mapping) and m]
    nested = [
        _layer(value)
        for layer in top
        for key, value in layer.items()
        if isinstance(value, Mapping) and value and not _NOT_METADATA.search(key)
    ]
    return top, nested


def _name(value: object) -> str | None:
    if isinstance(value, Mapping):  # {"name": "Ann", "id": 7}: its name, one level down
        fields = _layer(value)
        value = next((fields[f] for f in _NAME_FIELDS if isinstance(fields.get(f), str)), None)
    if not isinstance(value, str):
        return None
    name = " ".join(value.replace("_", " ").split())  # OpenAI's names: "Caroline_Smith"
    if len(name) > _LONGEST_NAME or not any(c.isalpha() for c in name):
        return None
    return name


def _speaker(
    data: Mapping[str, Any], top: list[dict[str, Any]], nested: list[dict[str, Any]]
) -> str | None:
    layers = top + nested
    for key in SPEAKER_KEYS:
        if key == "name" and (own := _name(data.get("name"))):
            return own
        # A bare "name" inside a mapping names what the mapping is about, not a speaker.
        for layer in top if key == "name" else layers:
            if key in layer and (found := _name(layer[key])):
                return found
    for layer in layers:  # speaker_label, message_author, sender_display_name, ...
        for key, value in layer.items():
            wanted = _SPEAKER_WORDS.search(key) and not _NOT_NAMES.search(key)
            if wanted and (found := _name(value)):
                return found
    extra = data.get("extra")
    role = extra.get("role") if isinstance(extra, Mapping) else None
    if isinstance(role, str) and role.lower() not in _ROLES:
        return _name(role)
    return None


def _dated(layers: list[dict[str, Any]]) -> Iterator[tuple[str, Any]]:
    """Every key and value that may hold the date, in the order they are tried."""
    for key in DATE_KEYS:
        for layer in layers:
            if key in layer:
                yield key, layer[key]
    later: list[tuple[str, Any]] = []
    for layer in layers:
        for key, value in layer.items():
            if key in DATE_KEYS or _NOT_DATES.search(key):
                continue
            if _DATE_WORDS.search(key):
                yield key, value
            elif (
                isinstance(value, str)
                and len(value) <= _LONGEST_DATE
                and not _NOT_FALLBACK.search(key)
                and _WRITTEN_DATE.match(value)
            ):
                later.append((key, value))  # {"session": "1:56 pm on 8 May, 2023"}
    yield from later


def _date(layers: list[dict[str, Any]]) -> str | None:
    found: _time.Moment | None = None
    clock: time | None = None
    for _, value in _dated(layers):
        here = _time.moment(value)
        if here is not None and found is None:
            found = here
        elif here is None and clock is None and isinstance(value, str):
            clock = _time.clock(value)
        if found is not None and (found.clock is not None or clock is not None):
            break
    if found is None:
        return None
    if found.clock is None and clock is not None:
        found = found._replace(clock=clock)
    return _time.spelled(found)


def _form(message: DemotedMessage) -> Mapping[str, Any] | None:
    """The message's neutral form, or its raw object's fields as one (duck-typed)."""
    if isinstance(message.data, Mapping):
        return message.data
    raw = message.raw
    if raw is None or isinstance(raw, Mapping | str | bytes):
        return None
    extra = {s: getattr(raw, s, None) for s in _SOURCES}
    role = getattr(raw, "role", None)
    extra["role"] = role.value if isinstance(role, Enum) else role
    return {"name": getattr(raw, "name", None), "extra": extra}


def message_context(message: DemotedMessage) -> dict[str, str] | None:
    """The speaker and the date ``message`` carries in its metadata: the default ``context=``.

    Args:
        message: A delivered message. Its neutral form (``data``) is read; a message
            without one (a hook's own) has the same fields read from its ``raw``
            object's attributes (``additional_kwargs``, ``response_metadata``,
            ``name``, ``role``), without importing any framework.

    Returns:
        ``{"speaker": ..., "date": ...}`` with the keys found (the date written as
        ``"1:56 pm on 8 May, 2023"``), or ``None`` when the message carries neither (or
        has no neutral form). See the module docstring for where each is looked for.
    """
    data = _form(message)
    if data is None:
        return None
    top, nested = _layers(data)
    layers = top + nested
    found: dict[str, str] = {}
    speaker = None if message.role == "tool" else _speaker(data, top, nested)
    if speaker:
        found["speaker"] = speaker
    when = _date(layers)
    if when:
        found["date"] = when
    return found or None
