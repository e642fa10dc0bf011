"""Pure conversion between LangChain messages and the core's records.

:func:`to_core` describes one ``BaseMessage`` for the planner, :func:`from_core` turns the
engine's :class:`~demote.engine.Window` back into the messages the model is sent. Neither
does I/O or keeps state. LangChain message ids are never used to place or recognise a
message: many stores drop them, so positions and fingerprints come from the engine (the
whole-message form keeps them, so an archived message comes back with its id).

Roles: human -> ``user``; AI (chunks included, so streamed replies count) -> ``assistant``;
system and ``developer`` -> ``system``; tool and function results -> ``tool``. A
``ChatMessage`` is mapped by its ``role`` string; a role the core does not know is read as
``assistant`` (it never starts a turn group, so it cannot split a tool exchange).

Whole messages. :func:`to_core` hands the engine the message's tool calls (names and
arguments) and content blocks, so its tokens are counted as a provider bills them and its
fingerprint changes when they do, and :func:`to_data` as the record's converter: at
delivery the hook gets the message's neutral form (:data:`demote.records.MESSAGE_DATA_KEYS`).
:func:`from_data` (and :func:`from_recalled` for what an archive returns) turns that form
back into the message, equal to the original: content (a string or its blocks), tool
calls, ``tool_call_id``, ``name``, ``id``, ``additional_kwargs``, ``response_metadata``,
usage, ``artifact``, ``status``, chunks as chunks. Values that are not JSON (an artifact
object, a ``datetime`` in ``additional_kwargs``) come back as their JSON form (ISO 8601
for dates and times, as pydantic writes them) or their ``repr``, and media stored by
reference come back without their bytes.

Counting whole messages: ``SlidingWindow.last_tokens(n, counter=message_counter(model))``
counts each message with the chat model's ``get_num_tokens_from_messages`` (or any
callable over a list of messages, like ``trim_messages``' ``token_counter``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import date, time
from typing import Any, Protocol

from langchain_core.language_models import BaseLanguageModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
)

from demote.engine import Window, render_summary
from demote.errors import ArgumentTypeError, ConfigError
from demote.records import ROLE_ALIASES, MessageRecord, Recalled, Role, text_data
from demote.window.clearing import clip_calls
from demote.window.tokens import MessageCounter

__all__ = [
    "Describe",
    "clipped_calls",
    "from_core",
    "from_data",
    "from_recalled",
    "message_counter",
    "message_role",
    "message_text",
    "replaced",
    "to_core",
    "to_data",
]

_CHAT_ROLES = ROLE_ALIASES

# The message type LangChain gives each core role, for a form without one (old rows).
_TYPES: dict[str, str] = {"user": "human", "assistant": "ai", "system": "system", "tool": "tool"}
# Fields the neutral form carries under its own keys (the rest go to ``extra``).
_OWN = frozenset({"content", "tool_calls", "tool_call_id", "name", "id", "type"})


class Describe(Protocol):
    """The signature of :meth:`demote.Demoter.describe`."""

    def __call__(
        self,
        role: Any,
        text: str,
        *,
        opens: Sequence[str] = (),
        answers: str | None = None,
        tool: str | None = None,
        calls: Sequence[Mapping[str, Any]] = (),
        blocks: Sequence[object] = (),
        message: object = None,
        to_data: Callable[[Any], dict[str, Any]] | None = None,
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
    if not isinstance(message, AIMessage) or not (message.tool_calls or message.invalid_tool_calls):
        return ()
    calls: list[Any] = [*message.tool_calls, *message.invalid_tool_calls]
    return tuple(call["id"] for call in calls if call.get("id"))


def _answers(message: BaseMessage) -> str | None:
    if isinstance(message, ToolMessage):
        return message.tool_call_id or None
    return None


def _calls(message: BaseMessage) -> list[dict[str, Any]]:
    if not isinstance(message, AIMessage) or not message.tool_calls:
        return []
    return [{"id": c.get("id"), "name": c["name"], "args": c["args"]} for c in message.tool_calls]


def _blocks(message: BaseMessage) -> list[object]:
    """The content blocks that are not plain text (what is counted beyond the text)."""
    content = message.content
    if isinstance(content, str):
        return []
    return [
        b
        for b in content
        if not isinstance(b, str) and not (isinstance(b, dict) and b.get("type") == "text")
    ]


def _tool(message: BaseMessage) -> str | None:
    return message.name if isinstance(message, ToolMessage | FunctionMessage) else None


# Message class -> its role when a message of it with text content holds nothing else to
# describe ("" when it may: results, chat messages, unknown classes). An isinstance check
# on a message class costs an abstract-class check; this is one dict lookup per message.
_PLAIN: dict[type, str] = {}


def _plain_role(cls: type) -> str:
    if issubclass(cls, HumanMessage):
        return "user"
    if issubclass(cls, AIMessage):
        return "assistant"  # (when it has no tool calls)
    if issubclass(cls, SystemMessage):
        return "system"
    return ""


def to_core(message: BaseMessage, describe: Describe) -> MessageRecord:
    """Describe one LangChain message for the planner.

    Args:
        message: The message (``AIMessageChunk`` and other chunks are accepted).
        describe: The demoter's :meth:`~demote.Demoter.describe`.

    Returns:
        The message's record: role, text, the tool-call ids it opens (an ``AIMessage``'s
        ``tool_calls``), the tool-call id it answers and the tool's name (a
        ``ToolMessage``), its tokens as billed (tool calls and blocks included), and
        :func:`to_data` as its converter for delivery.
    """
    content = message.content
    if type(content) is str:  # text only (most chat messages): no calls, blocks or answers
        plain = _PLAIN.get(type(message))
        if plain is None:
            plain = _PLAIN[type(message)] = _plain_role(type(message))
        if plain and (
            plain != "assistant" or not (message.tool_calls or message.invalid_tool_calls)  # type: ignore[attr-defined]
        ):
            return describe(plain, content, message=message, to_data=to_data)
    return describe(
        message_role(message),
        message_text(message),
        opens=_opens(message),
        answers=_answers(message),
        tool=_tool(message),
        calls=_calls(message),
        blocks=_blocks(message),
        message=message,
        to_data=to_data,
    )


def clipped_calls(message: BaseMessage, marker: str) -> BaseMessage:
    """A copy of an assistant message with its long tool-call argument values cut.

    What a window sends for an old call too large for it (``Window.clipped``): each call's
    arguments are :func:`demote.window.clearing.clip_calls` of them, ending each cut value
    with ``marker``; ids, names, argument keys and the text stay, and so do tool-use
    content blocks, with the same arguments (langchain-anthropic sends those). A message
    with nothing to cut is returned as it is.

    Args:
        message: The assistant message.
        marker: :func:`demote.window.clearing.call_marker` of its archived key.
    """
    calls = _calls(message)
    clipped = clip_calls(calls, marker) if calls else None
    if clipped is None or not isinstance(message, AIMessage):
        return message
    args = {c["id"]: c["args"] for c in clipped}
    update: dict[str, Any] = {
        "tool_calls": [{**c, "args": args.get(c.get("id"), c["args"])} for c in message.tool_calls]
    }
    if isinstance(message.content, list):
        update["content"] = [
            {**b, "input": args[b.get("id")]}
            if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") in args
            else b
            for b in message.content
        ]
    return message.model_copy(update=update)


def replaced(message: BaseMessage, text: str | None) -> BaseMessage:
    """``message`` as a window sends it, given its ``Window.replacement`` (``None``: as is).

    A tool result gets the placeholder as its content (a copy: ids, name, artifact and
    status kept); an assistant message's calls are cut (:func:`clipped_calls`).
    """
    if text is None:
        return message
    if isinstance(message, AIMessage):
        return clipped_calls(message, text)
    return message.model_copy(update={"content": text})


def _jsonable(value: Any) -> Any:
    """``value`` as JSON holds it (tuples become lists; other objects their JSON or repr)."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=_fallback))


def _fallback(value: Any) -> Any:
    if isinstance(value, date | time):  # as pydantic's JSON mode (LlamaIndex's form) writes it
        return value.isoformat()
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    return repr(value)


def to_data(message: BaseMessage) -> dict[str, Any]:
    """The neutral, JSON-serializable form of a LangChain message.

    Args:
        message: Any LangChain message or chunk.

    Returns:
        A dict with the keys of :data:`demote.records.MESSAGE_DATA_KEYS`: ``blocks`` holds the
        content when it is a list (media as given: base64 stays until a hook stores it
        by reference); ``extra`` the message type and every other field that is not at
        its default (``additional_kwargs``, ``response_metadata``, ``usage_metadata``,
        ``invalid_tool_calls``, ``artifact``, ``status``, a chat role, chunk fields).
    """
    data: dict[str, Any] = {"role": message_role(message), "text": message_text(message)}
    if not isinstance(message.content, str):
        data["blocks"] = _jsonable(list(message.content))
    calls = _calls(message)
    if calls:
        data["tool_calls"] = _jsonable(calls)
    if isinstance(message, ToolMessage):
        data["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        data["tool" if isinstance(message, ToolMessage | FunctionMessage) else "name"] = (
            message.name
        )
    if message.id is not None:
        data["id"] = message.id
    extra: dict[str, Any] = {"type": message.type}
    fields = type(message).model_fields
    for field, info in fields.items():
        if field in _OWN:
            continue
        value = getattr(message, field)
        if value != info.get_default(call_default_factory=True):
            extra[field] = value
    data["extra"] = _jsonable(extra)
    return data


def from_data(data: Mapping[str, Any]) -> BaseMessage:
    """The LangChain message a neutral form describes (the inverse of :func:`to_data`).

    A form without ``extra`` (an archive row written before whole messages, or by a
    hook that only knew the text) gives the plain message of its role: ``HumanMessage``,
    ``AIMessage``, ``SystemMessage`` or ``ToolMessage``.

    Raises:
        ConfigError: ``data`` is not a neutral form (no known role, or fields LangChain
            refuses).
    """
    if not isinstance(data, Mapping):
        raise ArgumentTypeError(f"data: expected a mapping, got {type(data).__name__}")
    extra = dict(data.get("extra") or {})
    role = data.get("role")
    kind = extra.pop("type", None) or _TYPES.get(str(role))
    if kind is None:
        raise ConfigError(f"data: unknown role {role!r:.40}")
    fields: dict[str, Any] = {**extra}
    fields["content"] = list(data["blocks"]) if "blocks" in data else str(data.get("text", ""))
    calls = data.get("tool_calls")
    if calls:
        fields["tool_calls"] = [
            {
                "name": c.get("name"),
                "args": c.get("args") or {},
                "id": c.get("id"),
                "type": "tool_call",
            }
            for c in calls
        ]
    if kind in ("tool", "ToolMessageChunk"):
        fields["tool_call_id"] = str(data.get("tool_call_id") or "")
    for key, field in (("tool", "name"), ("name", "name"), ("id", "id")):
        if data.get(key) is not None:
            fields[field] = data[key]
    try:
        return messages_from_dict([{"type": kind, "data": fields}])[0]
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"data: not a LangChain message of type {kind!r}: {exc}") from exc


def from_recalled(recalled: Recalled) -> BaseMessage:
    """The LangChain message an archive gave back (its whole form, else its text)."""
    data = recalled.data
    if data is None:
        data = text_data(recalled.role, recalled.text)
    return from_data(data)


def message_counter(
    counter: BaseLanguageModel[Any] | Callable[[list[BaseMessage]], int],
) -> MessageCounter:
    """A policy counter that counts whole LangChain messages.

    ``SlidingWindow.last_tokens(4000, counter=message_counter(model))`` counts each
    message once (cached by fingerprint) with the chat model's
    ``get_num_tokens_from_messages``; any callable over a list of messages works too
    (``count_tokens_approximately``, a ``trim_messages`` ``token_counter``). Register it
    with :func:`demote.window.tokens.register_counter` to write the policy to JSON.

    Raises:
        ArgumentTypeError: ``counter`` is neither a language model nor callable.
    """
    if isinstance(counter, BaseLanguageModel):
        return MessageCounter(
            counter.get_num_tokens_from_messages, HumanMessage, type(counter).__name__
        )
    if not callable(counter):
        raise ArgumentTypeError(
            f"counter: expected a language model or a callable over messages, got {counter!r:.80}"
        )
    return MessageCounter(counter, HumanMessage, getattr(counter, "__name__", "messages"))


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
