"""Pure conversion between LlamaIndex chat messages and the core's records.

:func:`to_core` describes one ``ChatMessage`` as a :class:`~demote.records.MessageRecord`;
:func:`from_core` builds the ``ChatMessage`` the memory adds to what it returns (the
running summary, recalled messages). No I/O, no state: both are plain functions.

Where LlamaIndex 0.14 keeps tool calls:

- an assistant message opens calls with ``ToolCallBlock`` blocks (``tool_call_id``), or,
  in older integrations and LlamaIndex's own test mocks, with
  ``additional_kwargs["tool_calls"]`` (OpenAI-style dicts with ``"id"``, objects with
  ``.id``, or ``ToolSelection`` objects with ``.tool_id``);
- a tool message answers one with ``additional_kwargs["tool_call_id"]`` (this is what
  ``FunctionAgent`` writes).

Only ``TextBlock`` text is message text; tool calls, thinking and media are not part of
it (tool calls travel as ``opens``), so the fingerprint of a message is stable however its
other blocks serialize.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock

from demote.records import MessageRecord, Recalled, Role

__all__ = [
    "Describe",
    "RECALL_PREFIX",
    "answered_call",
    "core_role",
    "from_core",
    "opened_calls",
    "recall_message",
    "text_of",
    "to_core",
]

#: How the memory introduces recalled messages to the model (one system message).
RECALL_PREFIX = "Relevant messages from earlier in this conversation:\n"

_ROLES: dict[MessageRole, Role] = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}


class Describe(Protocol):
    """What :func:`to_core` calls to make a record (``Demoter.describe``)."""

    def __call__(
        self, role: Any, text: str, *, opens: Sequence[str] = (), answers: str | None = None
    ) -> MessageRecord:
        """Describe one message."""


def core_role(message: ChatMessage) -> Role:
    """The core role of a message (developer is system; function, tool; model, assistant)."""
    # MessageRole is a str enum, so its members and their plain-string values hash and
    # compare alike: look the role up as it is; the MessageRole(...) call (a costly enum
    # lookup) is only the fallback, and still rejects a role that is no MessageRole.
    role = _ROLES.get(message.role)
    return role if role is not None else _ROLES.get(MessageRole(message.role), "user")


def text_of(message: ChatMessage) -> str:
    """The message's text: its ``TextBlock`` texts joined by newlines."""
    return "\n".join([b.text for b in message.blocks if isinstance(b, TextBlock)])


def _call_id(item: Any) -> str | None:
    if isinstance(item, dict):
        for name in ("id", "tool_call_id", "tool_id"):
            value = item.get(name)
            if isinstance(value, str) and value:
                return value
        return None
    for name in ("id", "tool_call_id", "tool_id"):
        value = getattr(item, name, None)
        if isinstance(value, str) and value:
            return value
    return None


def opened_calls(message: ChatMessage) -> tuple[str, ...]:
    """Ids of the tool calls a message opens, in order, without repeats."""
    found: list[str] = [
        b.tool_call_id for b in message.blocks if isinstance(b, ToolCallBlock) and b.tool_call_id
    ]
    legacy = message.additional_kwargs.get("tool_calls")
    if legacy is None and not found:  # most messages: no calls at all
        return ()
    if isinstance(legacy, Iterable) and not isinstance(legacy, str | bytes | dict):
        found.extend(cid for cid in map(_call_id, legacy) if cid is not None)
    return tuple(dict.fromkeys(found))


def answered_call(message: ChatMessage) -> str | None:
    """Id of the tool call a tool message answers (``additional_kwargs["tool_call_id"]``)."""
    return _tool_call_id(message) if core_role(message) == "tool" else None


def _tool_call_id(message: ChatMessage) -> str | None:
    value = message.additional_kwargs.get("tool_call_id")
    return value if isinstance(value, str) and value else None


def to_core(message: ChatMessage, describe: Describe) -> MessageRecord:
    """Describe a LlamaIndex message for the planner.

    Args:
        message: The message.
        describe: Makes the record (``Demoter.describe``: fingerprint and cached tokens).

    Returns:
        The message's record: role, text, opened tool-call ids, answered tool-call id.
    """
    role = core_role(message)
    answers = _tool_call_id(message) if role == "tool" else None  # answered_call, role known
    return describe(role, text_of(message), opens=opened_calls(message), answers=answers)


def from_core(role: Role | str, text: str) -> ChatMessage:
    """A LlamaIndex message with ``role`` and ``text`` (summary, recall, tests)."""
    return ChatMessage(role=MessageRole(role), blocks=[TextBlock(text=text)])


def recall_message(recalled: Sequence[Recalled]) -> ChatMessage:
    """The one system message that carries recalled messages, oldest first.

    Args:
        recalled: What a recall returned (already filtered and cut to ``k``).

    Returns:
        A system message: :data:`RECALL_PREFIX`, then one ``role: text`` line each.
    """
    ordered = sorted(recalled, key=lambda r: r.index if r.index >= 0 else float("inf"))
    lines = [f"- {r.role}: {r.text}" for r in ordered]
    return from_core("system", RECALL_PREFIX + "\n".join(lines))
