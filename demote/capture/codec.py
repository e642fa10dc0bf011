"""What a Recorder item is: blank or not, its dedup key, and its durable form.

Items are :class:`~demote.records.Demotion` batches, :class:`~demote.records.CapturedTurn`
records, or any JSON-serialisable value. These functions are pure (no I/O), shared by the
thread and asyncio Recorders and by the outbox.

Durable form (one JSON object per item, ``"v": 1``):

* ``Demotion``: conversation id, fencing token (if any) and, per message, role, text,
  index, key and, when known, the whole message (``DemotedMessage.data``, the neutral
  form, media bytes included as given): ``[role, text, index, key]`` or
  ``[role, text, index, key, data]``; payloads of either shape are read back.
  ``DemotedMessage.raw`` (the framework's own message object) is **not** persisted: an
  item read back from an outbox has ``raw=None`` and its ``data``, which is what the
  built-in hooks store.
* ``CapturedTurn``: all five fields.
* anything else: stored as strict JSON (no NaN or infinity). It comes back as JSON does:
  tuples as lists, non-string dict keys as strings.

Text is stored as :func:`~demote.records.storable_text` makes it: a lone surrogate
comes back as U+FFFD.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from demote.errors import ConfigError, StoreError
from demote.records import ROLES, CapturedTurn, DemotedMessage, Demotion, storable_text

__all__ = ["conversation_of", "decode", "dedup_key", "encode", "is_blank"]

_VERSION = 1
_MAX_KEY = 16_384  # as long as a conversation id may be


def is_blank(item: object) -> bool:
    """Whether ``item`` carries nothing worth delivering.

    Blank: ``None``, a blank ``str``, a ``Demotion`` without messages, a ``CapturedTurn``
    whose text is blank. Everything else (including empty lists and dicts) is content.
    """
    if item is None:
        return True
    if isinstance(item, str):
        return not item.strip()
    if isinstance(item, Demotion):
        return not item.messages
    if isinstance(item, CapturedTurn):
        return not item.text.strip()
    return False


def conversation_of(item: object) -> str | None:
    """The conversation ``item`` belongs to (records only: a plain value has none)."""
    if isinstance(item, Demotion | CapturedTurn):
        return item.conversation_id
    return None


def dedup_key(item: object, key: str | None = None) -> str:
    """The key a sink can use to drop repeats of ``item`` (delivery is at-least-once).

    Args:
        item: The item.
        key: A caller-provided key; wins for plain values, ignored for records.

    Returns:
        For a ``Demotion``, a hash of its conversation id and message keys (the same in
        every process); for a ``CapturedTurn``, its ``key``; otherwise ``key`` or, if none
        was given, a fresh uuid4 hex (unique, so it only deduplicates outbox re-deliveries).
    """
    if isinstance(item, Demotion):
        h = hashlib.blake2b(digest_size=16)
        h.update(item.conversation_id.encode("utf-8", "surrogatepass"))
        for message in item.messages:
            h.update(b"\x00")
            h.update(message.key.encode("utf-8", "surrogatepass"))
        return h.hexdigest()
    if isinstance(item, CapturedTurn):
        return item.key
    if key is not None:
        if not isinstance(key, str) or not key or "\x00" in key or len(key) > _MAX_KEY:
            raise ConfigError(
                f"key must be a non-empty str of at most {_MAX_KEY} characters without NUL, "
                f"got {key!r:.40}"
            )
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:  # an outbox could not store it; lossy would merge keys
            raise ConfigError(f"key is not valid Unicode text: {key!r:.40}") from None
        return key
    return uuid.uuid4().hex


def encode(item: object) -> str:
    """Serialise ``item`` for the outbox.

    Raises:
        ConfigError: ``item`` is not a record and not strict JSON.
    """
    doc: dict[str, Any]
    if isinstance(item, Demotion):
        doc = {
            "kind": "demotion",
            "conversation_id": item.conversation_id,
            "messages": [_message(m) for m in item.messages],
        }
        if item.fence is not None:
            doc["fence"] = item.fence
    elif isinstance(item, CapturedTurn):
        doc = {
            "kind": "turn",
            "conversation_id": item.conversation_id,
            "role": item.role,
            "text": item.text,
            "index": item.index,
            "key": item.key,
        }
    else:
        doc = {"kind": "json", "value": item}
    doc["v"] = _VERSION
    try:
        # A lone surrogate in any text becomes U+FFFD (storable_text), as in every store:
        # SQLite cannot hold it, and refusing the item would block its conversation.
        text = json.dumps(doc, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        return storable_text(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(
            f"an outbox item must be a Demotion, a CapturedTurn or strict JSON; "
            f"cannot serialise {type(item).__name__}: {exc}"
        ) from exc


def decode(payload: str) -> Any:
    """Read back an item written by :func:`encode`.

    Raises:
        StoreError: The payload is not one :func:`encode` wrote (a corrupt outbox row).
    """
    try:
        doc = json.loads(payload)
        kind = doc["kind"]
        if doc.get("v") != _VERSION:
            raise ValueError(f"unknown payload version {doc.get('v')!r}")
        if kind == "json":
            return doc["value"]
        if kind == "turn":
            return CapturedTurn(
                conversation_id=str(doc["conversation_id"]),
                role=_role(doc["role"]),
                text=str(doc["text"]),
                index=int(doc["index"]),
                key=str(doc["key"]),
            )
        if kind == "demotion":
            messages = tuple(_read_message(m) for m in doc["messages"])
            fence = doc.get("fence")
            if fence is not None and (isinstance(fence, bool) or not isinstance(fence, int)):
                raise ValueError(f"fence must be an int, got {fence!r}")
            return Demotion(str(doc["conversation_id"]), messages, fence)
        raise ValueError(f"unknown payload kind {kind!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"cannot read outbox payload: {exc}") from exc


def _message(m: DemotedMessage) -> list[Any]:
    row: list[Any] = [m.role, m.text, m.index, m.key]
    if m.data is not None:
        row.append(m.data)
    return row


def _read_message(row: Any) -> DemotedMessage:
    if not isinstance(row, list) or len(row) not in (4, 5):
        raise ValueError(f"a message must be a list of 4 or 5 fields, got {row!r:.80}")
    data = row[4] if len(row) == 5 else None
    if data is not None and not isinstance(data, dict):
        raise ValueError(f"a message's data must be an object, got {type(data).__name__}")
    role, text, index, key = row[:4]
    return DemotedMessage(_role(role), str(text), int(index), str(key), None, data)


def _role(value: object) -> Any:
    if value not in ROLES:
        raise ValueError(f"unknown role {value!r}")
    return value
