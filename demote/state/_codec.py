"""What every durable store shares: state encoding and checking, id and TTL checks.

A durable store never trusts what it reads back: a row or value of the wrong shape (a
column holding text, JSON of another type, a foreign key at our name) is a
:class:`StoreError`, never a ``TypeError`` from deep inside the engine.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

from demote._validate import seconds
from demote.errors import ConversationIdError, StoreError
from demote.records import ConversationState
from demote.state.base import validate_conversation_id

__all__ = [
    "COLUMNS",
    "check_ttl",
    "decode_state",
    "encode_state",
    "state_from_row",
    "storable_id",
]

#: The fields of a state, in order: the column order of the SQL stores.
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ConversationState))
_TEXT = frozenset({"anchor", "summary"})
_STR = frozenset({"trail"})  # text, never None


def encode_state(state: ConversationState) -> str:
    """``state`` as compact JSON with sorted keys (equal states encode equally)."""
    return json.dumps(asdict(state), sort_keys=True, separators=(",", ":"))


def state_from_row(row: tuple[Any, ...] | list[Any]) -> ConversationState:
    """The state a row of :data:`COLUMNS` holds; :class:`StoreError` if it is not one."""
    if len(row) != len(COLUMNS):
        raise StoreError(f"stored conversation state has {len(row)} fields, not {len(COLUMNS)}")
    for name, value in zip(COLUMNS, row, strict=True):
        if name in _TEXT:
            ok = value is None or isinstance(value, str)
        elif name in _STR:
            ok = isinstance(value, str)
        else:  # a count or an index: a negative one would send the planner astray
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if not ok:
            raise StoreError(
                f"stored conversation state is corrupt: {name} is {type(value).__name__} "
                f"{value!r:.40}"
            )
    return ConversationState(*row)


def decode_state(text: str | bytes) -> ConversationState:
    """The state ``encode_state`` wrote; :class:`StoreError` if it is not one."""
    try:
        data = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise StoreError(f"stored conversation state is corrupt: {exc}") from exc
    if isinstance(data, dict):
        data.setdefault("trail", "")  # written before states had a trail
        data.setdefault("cleared", 0)  # written before states had a clearing watermark
    if not isinstance(data, dict) or set(data) != set(COLUMNS):
        raise StoreError(f"stored conversation state is corrupt: {str(data)[:80]!r}")
    return state_from_row([data[name] for name in COLUMNS])


def storable_id(conversation_id: object) -> str:
    """A conversation id a durable store can key on, else :class:`ConversationIdError`.

    On top of :func:`~demote.state.base.validate_conversation_id`, the id must be valid
    Unicode text (no lone surrogates): SQLite, Redis and PostgreSQL store text as UTF-8,
    and a lossy encoding would merge two conversations.
    """
    cid = validate_conversation_id(conversation_id)
    try:
        cid.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConversationIdError(
            f"conversation_id is not valid Unicode text ({exc.reason} at {exc.start})"
        ) from None
    return cid


def check_ttl(ttl: object) -> float:
    """``ttl`` if it is a finite number of seconds > 0, else :class:`ConfigError`."""
    return seconds("lease ttl", ttl)  # (a huge int made math.isfinite raise OverflowError)
