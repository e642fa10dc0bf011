"""Pure conversion between LangChain messages and the core's records.

:func:`to_core` describes one ``BaseMessage`` for the planner, :func:`from_core` turns the
engine's :class:`~demote.engine.Window` back into the messages the model is sent. Neither
does I/O or keeps state. LangChain message ids are never used: many stores drop them, so
positions and fingerprints come from the engine.

Roles: human -> ``user``; AI (chunks included, so streamed replies count) -> ``assistant``;
system and ``developer`` -> ``system``; tool and function results -> ``tool``. A
``ChatMessage`` is mapped by its ``role`` string; a role the core does not know is read as
``assistant`` (it never starts a turn group, so it cannot split a tool exchange).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from demote.engine import Window, render_summary
from demote.records import ROLE_ALIASES, MessageRecord, Role

__all__ = ["Describe", "from_core", "message_role", "message_text", "to_core"]

_CHAT_ROLES = ROLE_ALIASES


class Describe(Protocol):
    """The signature of :meth:`demote.Demoter.describe`."""

    def __call__(
        self, role: Any, text: str, *, opens: Sequence[str] = (), answers: str | None = None
    ) -> MessageRecord:
        """Describe one message for the planner."""


def message_role(message: BaseMessage) -> Role:
    """The core role of a LangChain message (see the module docstring for the mapping).

    Args:
        message: Any LangChain message or message chunk.

    Returns:
        ``system``, ``user``, ``assistant`` or ``tool``.
    """
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        return "assistant"
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, ToolMessage | FunctionMessage):
        return "tool"
    if isinstance(message, ChatMessage):
        return _CHAT_ROLES.get(message.role.lower(), "assistant")
    return _CHAT_ROLES.get(message.type.lower().removesuffix("messagechunk"), "assistant")


def message_text(message: BaseMessage) -> str:
    """The text of a message: its string content, or its text blocks joined by newlines.

    Non-text blocks (images, tool-use blocks, reasoning) are left out; tool calls are
    described by their ids, not by text.

    Args:
        message: Any LangChain message.

    Returns:
        The text, possibly empty.
    """
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str):
                parts.append(text)
    return "\n".join(parts)


def _opens(message: BaseMessage) -> tuple[str, ...]:
    if not isinstance(message, AIMessage):
        return ()
    calls: list[Any] = [*message.tool_calls, *message.invalid_tool_calls]
    return tuple(call["id"] for call in calls if call.get("id"))


def _answers(message: BaseMessage) -> str | None:
    if isinstance(message, ToolMessage):
        return message.tool_call_id or None
    return None


def to_core(message: BaseMessage, describe: Describe) -> MessageRecord:
    """Describe one LangChain message for the planner.

    Args:
        message: The message (``AIMessageChunk`` and other chunks are accepted).
        describe: The demoter's :meth:`~demote.Demoter.describe`.

    Returns:
        The message's record: role, text, the tool-call ids it opens (an ``AIMessage``'s
        ``tool_calls``) and the tool-call id it answers (a ``ToolMessage``).
    """
    return describe(
        message_role(message),
        message_text(message),
        opens=_opens(message),
        answers=_answers(message),
    )


def from_core(window: Window[BaseMessage]) -> list[BaseMessage]:
    """The messages the model is sent for a window.

    Args:
        window: What :meth:`demote.Demoter.load` returned.

    Returns:
        The pinned system messages, then the running summary as one ``SystemMessage``
        (if there is one), then the kept messages.
    """
    out = list(window.pinned)
    if window.summary is not None:
        out.append(SystemMessage(render_summary(window.summary)))
    out.extend(window.messages)
    return out
