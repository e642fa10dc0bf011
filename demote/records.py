"""The core's small frozen records.

Adapters translate framework messages into :class:`MessageRecord` (see :func:`describe`),
the planner works on those, and hooks receive :class:`Demotion` batches. Every record is
immutable, slotted and cheap to compare, so tests can assert on them directly.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from demote.errors import ConfigError

__all__ = [
    "MESSAGE_DATA_KEYS",
    "ROLES",
    "ROLE_ALIASES",
    "TRAIL_DIGITS",
    "TRAIL_KEPT",
    "CapturedTurn",
    "ConversationState",
    "DemotedMessage",
    "Demotion",
    "MessageRecord",
    "Recalled",
    "Role",
    "fingerprint",
    "keys_of",
    "make_key",
    "parts_digest",
    "searchable_text",
    "storable_text",
    "text_data",
]

#: The keys of the framework-neutral form of a whole message (``DemotedMessage.data``,
#: ``Recalled.data``), a JSON object: ``role`` and ``text`` always; ``tool_calls`` (a list
#: of ``{"id", "name", "args"}``) on an assistant message that calls tools;
#: ``tool_call_id`` and ``tool`` (the tool's name) on a tool result; ``blocks`` (present
#: when the message's content is a list of blocks: all of them, in order, text blocks
#: included, so images, audio, files and reasoning keep their place; media by reference
#: or as base64 bytes, see :func:`demote.window.media.data_by_reference`); ``id``,
#: ``name`` and ``extra`` (framework fields kept so the message comes back equal to the
#: original: the adapters' ``from_data``). Absent keys mean empty.
MESSAGE_DATA_KEYS = (
    "role",
    "text",
    "tool_calls",
    "tool_call_id",
    "tool",
    "blocks",
    "id",
    "name",
    "extra",
)

#: Hex digits of each short fingerprint in :attr:`ConversationState.trail`.
TRAIL_DIGITS = 8
#: How many messages before the window start :attr:`ConversationState.trail` covers.
TRAIL_KEPT = 64

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})

#: Role names other libraries use, mapped to the core's (LangChain's message types,
#: OpenAI's roles).
ROLE_ALIASES: dict[str, Role] = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}


def fingerprint(
    role: str,
    text: str,
    opens: Sequence[str] = (),
    answers: str | None = None,
    parts: str | None = None,
) -> str:
    """A stable fingerprint of one message's content (the same in every process).

    Args:
        role: One of ``system``, ``user``, ``assistant``, ``tool``.
        text: The message text.
        opens: Ids of the tool calls the message opens.
        answers: Id of the tool call the message answers.
        parts: What the message holds beyond its text (:func:`parts_digest` of its tool
            calls and blocks), or ``None``: a message with text only keeps the
            fingerprint it always had, so stored state stays valid.

    Returns:
        A 32-character hex digest.
    """
    h = hashlib.blake2b(role.encode() + b"\x00", digest_size=16)
    h.update(text.encode("utf-8", "surrogatepass"))
    for call_id in opens:
        h.update(b"\x01")
        h.update(call_id.encode("utf-8", "surrogatepass"))
    if answers is not None:
        h.update(b"\x02")
        h.update(answers.encode("utf-8", "surrogatepass"))
    if parts is not None:
        h.update(b"\x03")
        h.update(parts.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _canonical(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=repr)


def parts_digest(
    calls: Sequence[Mapping[str, Any]] = (), blocks: Sequence[object] = ()
) -> str | None:
    """A digest of a message's tool calls (names and arguments) and non-text blocks.

    ``None`` when there are none, so :func:`fingerprint` of a text-only message is
    unchanged; edited arguments or blocks give another digest (the message is counted
    and delivered again).
    """
    if not calls and not blocks:
        return None
    h = hashlib.blake2b(digest_size=16)
    h.update(_canonical([[c.get("id"), c.get("name"), c.get("args")] for c in calls]).encode())
    h.update(b"\x00")
    h.update(_canonical(list(blocks)).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def text_data(
    role: str, text: str, answers: str | None = None, tool: str | None = None
) -> dict[str, Any]:
    """The neutral form of a message known by its text alone (and the call it answers)."""
    data: dict[str, Any] = {"role": role, "text": text}
    if answers is not None:
        data["tool_call_id"] = answers
    if tool is not None:
        data["tool"] = tool
    return data


def searchable_text(text: str, data: Mapping[str, Any] | None) -> str:
    """What a store indexes for a message: its text, then one line per tool call.

    A call reads ``name {json arguments}``, so a search for a tool's name or for an
    argument value finds the message that made the call (whose text is often empty).
    """
    calls = data.get("tool_calls") if data else None
    if not calls:
        return text
    lines = [text] if text else []
    for call in calls:
        if isinstance(call, Mapping):
            lines.append(f"{call.get('name') or ''} {_canonical(call.get('args') or {})}")
    return "\n".join(lines)


def storable_text(text: str) -> str:
    """``text`` as UTF-8 can hold it: each lone surrogate becomes U+FFFD.

    The one rule for text demote writes to a store (archive, outbox, summary): SQLite,
    PostgreSQL and Redis keep UTF-8, which cannot encode a lone surrogate (Python text can
    hold one, e.g. from ``json.loads`` of an escaped surrogate). The rest of the text is
    kept as it is. Fingerprints and dedup keys are computed from the text as given, so
    they never change with this. Conversation ids are not cleaned: they are refused
    (:func:`~demote.state.base.validate_conversation_id`), since a lossy id could merge two
    conversations.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def make_key(conversation_id: str, index: int, message_fingerprint: str) -> str:
    """The stable dedup key of a message: conversation, position and fingerprint.

    The same message at the same place in the same conversation always has the same key,
    in every process; built-in hooks are idempotent on it.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(conversation_id.encode("utf-8", "surrogatepass"))
    h.update(b"\x00")
    h.update(str(index).encode())
    h.update(b"\x00")
    h.update(message_fingerprint.encode())
    return h.hexdigest()


def keys_of(conversation_id: str, records: Iterable[tuple[int, MessageRecord]]) -> list[str]:
    """Every key the messages at these positions were delivered under, in any release.

    :func:`make_key` of each record's fingerprint, and of its legacy one when it has one
    (what an earlier release named it by), in order: what an erase must reach.
    """
    return [make_key(conversation_id, i, fp) for i, rec in records for fp in rec.fingerprints]


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """What the core knows about one message: made by adapters, read by the planner.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        text: The message text (tool calls are not part of it).
        fingerprint: Stable content fingerprint (see :func:`fingerprint`).
        tokens: Token count under the policy's counter.
        opens: Ids of the tool calls this message opens (assistant messages).
        answers: Id of the tool call this message answers (tool messages).
        tool: Name of the tool whose result this is (tool messages), when known: what
            clearing's ``exclude`` matches.
        to_data: Makes the message's neutral form (:data:`MESSAGE_DATA_KEYS`) from the
            framework message, when it is delivered (a shared function of the adapter,
            so a cached record holds one reference, not the form); ``None``: the
            record's text and ids are all a hook gets.
        clipped_tokens: What an assistant message counts when its long tool-call argument
            values are cut (:func:`demote.window.clearing.clip_calls`, as a window sends
            an old call too large for it); ``None`` when it has none to cut.
        legacy: The fingerprint releases before the whole-message form gave this message
            (role, text, call ids and the answered id, without :func:`parts_digest`),
            when its tool calls or blocks make today's differ; ``None`` otherwise. The
            state and the keys those releases wrote name the message by it, so it is
            matched too wherever stored fingerprints and keys are (:meth:`known_as`).
    """

    role: Role
    text: str
    fingerprint: str
    tokens: int
    opens: tuple[str, ...] = ()
    answers: str | None = None
    tool: str | None = None
    to_data: Callable[[Any], dict[str, Any]] | None = field(default=None, compare=False, repr=False)
    clipped_tokens: int | None = None
    legacy: str | None = field(default=None, compare=False, repr=False)

    @property
    def fingerprints(self) -> tuple[str, ...]:
        """Every fingerprint the message is known by: today's, then the :attr:`legacy` one."""
        return (self.fingerprint,) if self.legacy is None else (self.fingerprint, self.legacy)

    def known_as(self, fp: str | None) -> bool:
        """Is ``fp`` one of :attr:`fingerprints`?"""
        return fp == self.fingerprint or (self.legacy is not None and fp == self.legacy)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"role must be one of {sorted(ROLES)}, got {self.role!r}")
        if self.tokens < 0:
            raise ConfigError(f"tokens must be >= 0, got {self.tokens}")


@dataclass(frozen=True, slots=True)
class ConversationState:
    """The durable demotion state of one conversation.

    Positions are absolute indexes into the conversation's full history.

    Attributes:
        window_start: Index of the first message kept in the active window; everything
            before it (after the pinned system messages) is demoted or summarized.
        delivered: Watermark: messages before this index were accepted by the hook.
            ``delivered <= window_start``; any gap is covered by the summary.
        pinned: How many leading system messages are pinned (never demoted).
        anchor: Fingerprint of the message at ``window_start - 1`` (rewrite detection).
        summary: The committed running summary (``Compact``), or ``None``.
        summarized: Messages before this index are covered by ``summary``.
        offset: Messages removed from the front of the inner store (pruned); absolute
            index = offset + position in the store.
        generation: Bumped on every clear, so stale work is recognised and discarded.
        trail: Short fingerprints (:data:`TRAIL_DIGITS` hex digits each) of the messages
            just before ``window_start``, oldest first, at most :data:`TRAIL_KEPT`: the
            last one is the anchor's. Any process recognises a stale, shorter copy of the
            history (read by a slow request before others appended to it) by its last
            message, without having seen it.
        cleared: Clearing watermark (absolute, never moves backwards but on a clear):
            tool results before it that are still in the window are sent to the model as
            placeholders (their content was handed to the hook first). ``delivered`` may
            run ahead of ``window_start`` up to here.
    """

    window_start: int = 0
    delivered: int = 0
    pinned: int = 0
    anchor: str | None = None
    summary: str | None = None
    summarized: int = 0
    offset: int = 0
    generation: int = 0
    trail: str = ""
    cleared: int = 0


@dataclass(frozen=True, slots=True)
class DemotedMessage:
    """One message handed to a hook.

    Attributes:
        role: The message role.
        text: The message text.
        index: Absolute position in the conversation.
        key: Stable dedup key (conversation, index, fingerprint).
        raw: The framework's own message object (``None`` after a restart from an outbox).
        data: The whole message in the framework-neutral, JSON-serializable form (see
            :data:`MESSAGE_DATA_KEYS`), or ``None`` where only the text is known.
    """

    role: Role
    text: str
    index: int
    key: str
    raw: Any = field(default=None, compare=False)
    data: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Demotion:
    """A batch of messages demoted from one conversation, oldest first.

    Attributes:
        conversation_id: The conversation.
        messages: The messages, oldest first.
        fence: The fencing token of the delivery lease the batch was sent under (``None``
            on a store without leases). Tokens only grow: a sink that has seen a higher
            token for the conversation may refuse this batch as coming from a stale worker.
    """

    conversation_id: str
    messages: tuple[DemotedMessage, ...]
    fence: int | None = None

    def __len__(self) -> int:
        return len(self.messages)

    def __str__(self) -> str:
        """A header, then ``[index] role: text`` per message (what ``print`` as a hook shows)."""
        msgs = self.messages
        span = f" (positions {msgs[0].index}-{msgs[-1].index})" if msgs else ""
        lines = [f"Demotion of {self.conversation_id!r}: {len(msgs)} messages{span}"]
        for m in msgs:
            text = m.text if len(m.text) <= _SHOWN_CHARS else m.text[: _SHOWN_CHARS - 3] + "..."
            lines.append(f"  [{m.index}] {m.role}: {' '.join(text.split())}")
        return "\n".join(lines)


#: Characters of a message's text ``str(Demotion)`` shows.
_SHOWN_CHARS = 200


@dataclass(frozen=True, slots=True)
class Recalled:
    """A message read back from the long tail for a query.

    Attributes:
        role: The message role.
        text: The message text.
        index: Absolute position in the conversation (``-1`` when the store has none).
        key: The dedup key it was stored under.
        score: Relevance, higher is better (comparable within one search only).
        data: The whole message as archived (see :data:`MESSAGE_DATA_KEYS`), or
            ``None`` for a text-only row.
        at: When it was archived (seconds since the epoch), or ``None`` when unknown.
    """

    role: str
    text: str
    index: int
    key: str
    score: float = 0.0
    data: dict[str, Any] | None = field(default=None, compare=False)
    at: float | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class CapturedTurn:
    """One new user turn sent to a capture sink (an extractor such as mem0).

    Attributes:
        conversation_id: The conversation it belongs to.
        role: Always the speaker's role (``user`` for the built-in adapters).
        text: Only the speaker's own words: never recalled, summary or system text.
        index: Absolute position in the conversation (``-1`` if unknown).
        key: Stable dedup key (see :func:`make_key`).
    """

    conversation_id: str
    role: Role
    text: str
    index: int
    key: str
