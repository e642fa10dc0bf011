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
it. :func:`to_core` hands the engine the calls (names and arguments) and the other blocks
too, so tokens are counted as billed and the fingerprint follows them (a text-only
message keeps the fingerprint it always had).

Whole messages: :func:`to_data` is the record's converter (the hook gets the neutral form,
:data:`demote.records.MESSAGE_DATA_KEYS`), :func:`from_data` / :func:`from_recalled` give the
``ChatMessage`` back, equal to the original: role, blocks (``model_dump(mode="json")``
each, validated back), ``additional_kwargs`` (``ToolSelection`` objects included). Media
stored by reference come back without their bytes. ``message_counter`` counts whole
messages (a callable over a list of ``ChatMessage``, or a LlamaIndex ``TokenCounter``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.tools import ToolSelection
from pydantic import ValidationError

from demote.errors import ArgumentTypeError, ConfigError
from demote.records import MessageRecord, Recalled, Role, text_data
from demote.request import RECALL_PREFIX, render_recall
from demote.window.clearing import clip_calls
from demote.window.tokens import MessageCounter

__all__ = [
    "CallNames",
    "Describe",
    "RECALL_PREFIX",
    "answered_call",
    "core_role",
    "from_core",
    "from_data",
    "from_recalled",
    "message_counter",
    "opened_calls",
    "recall_message",
    "replaced",
    "text_of",
    "to_core",
    "to_data",
    "tool_calls",
]

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


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _legacy_call(item: Any) -> dict[str, Any] | None:
    """``{"id", "name", "args"}`` of an OpenAI-style dict, a ``ToolSelection`` or alike."""
    if isinstance(item, ToolSelection):
        return {"id": item.tool_id, "name": item.tool_name, "args": item.tool_kwargs}
    function = _field(item, "function")
    if function is not None:
        name, args = _field(function, "name"), _field(function, "arguments")
        return {"id": _call_id(item), "name": name, "args": _args(args)}
    name = _field(item, "name") or _field(item, "tool_name")
    if name is None:
        return None
    args = _field(item, "args")
    return {
        "id": _call_id(item),
        "name": name,
        "args": _args(_field(item, "tool_kwargs") if args is None else args),
    }


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def tool_calls(message: ChatMessage) -> list[dict[str, Any]]:
    """The message's tool calls as ``{"id", "name", "args"}`` (blocks, then legacy)."""
    found = [
        {"id": b.tool_call_id, "name": b.tool_name, "args": _args(b.tool_kwargs)}
        for b in message.blocks
        if isinstance(b, ToolCallBlock)
    ]
    legacy = message.additional_kwargs.get("tool_calls")
    if isinstance(legacy, Iterable) and not isinstance(legacy, str | bytes | dict):
        seen = {c["id"] for c in found}
        for item in legacy:
            call = _legacy_call(item)
            if call is not None and (call["id"] is None or call["id"] not in seen):
                found.append(call)
    return found


def _other_blocks(message: ChatMessage) -> list[object]:
    return [
        b.model_dump(mode="json")
        for b in message.blocks
        if not isinstance(b, TextBlock | ToolCallBlock)
    ]


def _tool_name(message: ChatMessage) -> str | None:
    for key in ("name", "tool_name"):
        value = message.additional_kwargs.get(key)
        if isinstance(value, str) and value:
            return value
    return None


class CallNames:
    """The tool names of the calls a conversation opened, by call id (bounded).

    LlamaIndex's ``FunctionAgent`` writes a tool result with its ``tool_call_id`` and no
    tool name; the name is in the call it answers. :func:`to_core` notes the calls of each
    assistant message it describes here and names a nameless result from them, so a
    result is counted as the provider bills it (and as LangChain counts the same
    ``ToolMessage``: its name included) and its placeholder names the tool. A memory
    describes its messages in order, a call before its results, and keeps one of these.
    """

    __slots__ = ("_names",)

    #: How many call ids are remembered (the newest; a result follows its call closely).
    KEPT = 4096

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def note(self, calls: Sequence[Mapping[str, Any]]) -> None:
        """Remember the names of ``calls`` (``{"id", "name", ...}`` each)."""
        names = self._names
        for call in calls:
            call_id, name = call.get("id"), call.get("name")
            if isinstance(call_id, str) and call_id and isinstance(name, str) and name:
                names[call_id] = name
        if len(names) > self.KEPT:  # drop the oldest half (dicts keep insertion order)
            for call_id in list(names)[: len(names) // 2]:
                names.pop(call_id, None)

    def get(self, call_id: str | None) -> str | None:
        """The name of the tool ``call_id`` called, if a described message opened it."""
        return None if call_id is None else self._names.get(call_id)


def to_core(
    message: ChatMessage, describe: Describe, names: CallNames | None = None
) -> MessageRecord:
    """Describe a LlamaIndex message for the planner.

    Args:
        message: The message.
        describe: Makes the record (``Demoter.describe``: fingerprint and cached tokens).
        names: The conversation's :class:`CallNames`: a tool result without a tool name
            in its ``additional_kwargs`` is named by the call it answers.

    Returns:
        The message's record: role, text, opened tool-call ids, answered tool-call id,
        the tool's name (a result), tokens as billed (tool calls and blocks included),
        :func:`to_data` as its converter for delivery.
    """
    blocks = message.blocks
    if not message.additional_kwargs and len(blocks) == 1 and type(blocks[0]) is TextBlock:
        # Most messages: one text block, no calls, no kwargs (so no call id or tool name):
        # what the general path below gives them, without its passes over the blocks.
        return describe(core_role(message), blocks[0].text, message=message, to_data=to_data)
    role = core_role(message)
    answers = _tool_call_id(message) if role == "tool" else None  # answered_call, role known
    opens = opened_calls(message)
    calls = tool_calls(message) if opens or message.additional_kwargs else ()
    tool = None
    if role == "tool":
        tool = _tool_name(message)
        if tool is None and names is not None:
            tool = names.get(answers)
    elif opens and names is not None:
        names.note(calls)
    return describe(
        role,
        text_of(message),
        opens=opens,
        answers=answers,
        tool=tool,
        calls=calls,
        blocks=() if _plain(message) else _other_blocks(message),
        message=message,
        to_data=to_data,
    )


def _plain(message: ChatMessage) -> bool:
    """A message whose only block is its text (it needs no ``blocks`` in the form)."""
    return len(message.blocks) == 1 and type(message.blocks[0]) is TextBlock


def to_data(message: ChatMessage) -> dict[str, Any]:
    """The neutral, JSON-serializable form of a LlamaIndex ``ChatMessage``.

    ``blocks`` holds every block's JSON dump unless the message is a single text block;
    ``extra`` holds the original role (when the core's differs: ``chatbot``, ``model``,
    ``developer``, ``function``) and ``additional_kwargs``, with ``ToolSelection``
    objects marked so they come back as such.
    """
    role = core_role(message)
    data: dict[str, Any] = {"role": role, "text": text_of(message)}
    dump = message.model_dump(mode="json")
    if not _plain(message):
        data["blocks"] = dump["blocks"]
    calls = tool_calls(message)
    if calls:
        data["tool_calls"] = json.loads(json.dumps(calls, default=repr))
    if role == "tool":
        answers, tool = _tool_call_id(message), _tool_name(message)
        if answers is not None:
            data["tool_call_id"] = answers
        if tool is not None:
            data["tool"] = tool
    extra: dict[str, Any] = {}
    if str(dump["role"]) != role:
        extra["role"] = str(dump["role"])
    if message.additional_kwargs:
        extra["additional_kwargs"] = dump["additional_kwargs"]
        legacy = message.additional_kwargs.get("tool_calls")
        if (
            isinstance(legacy, list)
            and legacy
            and all(isinstance(x, ToolSelection) for x in legacy)
        ):
            extra["tool_selections"] = True
    if extra:
        data["extra"] = extra
    return data


def from_data(data: Mapping[str, Any]) -> ChatMessage:
    """The ``ChatMessage`` a neutral form describes (the inverse of :func:`to_data`).

    A form without blocks or extra (an archive row written before whole messages)
    gives a message of one text block; a tool result keeps its ``tool_call_id``.

    Raises:
        ArgumentTypeError: ``data`` is not a mapping.
        ConfigError: LlamaIndex refuses the form (an unknown role or block).
    """
    if not isinstance(data, Mapping):
        raise ArgumentTypeError(f"data: expected a mapping, got {type(data).__name__}")
    extra = data.get("extra") or {}
    kwargs: dict[str, Any] = dict(extra.get("additional_kwargs") or {})
    if data.get("role") == "tool":
        for key, field in (("tool_call_id", "tool_call_id"), ("tool", "name")):
            if data.get(key) is not None and field not in kwargs and "extra" not in data:
                kwargs[field] = data[key]
    if extra.get("tool_selections"):
        kwargs["tool_calls"] = [ToolSelection.model_validate(c) for c in kwargs["tool_calls"]]
    blocks = data.get("blocks")
    if blocks is None:
        blocks = [{"block_type": "text", "text": str(data.get("text", ""))}]
    try:
        return ChatMessage.model_validate(
            {
                "role": extra.get("role") or data.get("role"),
                "additional_kwargs": kwargs,
                "blocks": blocks,
            }
        )
    except (ValidationError, ValueError, TypeError) as exc:
        raise ConfigError(f"data: not a LlamaIndex message: {exc}") from exc


def from_recalled(recalled: Recalled) -> ChatMessage:
    """The ``ChatMessage`` an archive gave back (its whole form, else its text)."""
    data = recalled.data
    return from_data(data if data is not None else text_data(recalled.role, recalled.text))


def message_counter(counter: Any) -> MessageCounter:
    """A policy counter that counts whole LlamaIndex messages.

    ``SlidingWindow.last_tokens(4000, counter=message_counter(fn))`` counts each message
    once (cached by fingerprint) with ``fn(list[ChatMessage]) -> int``, or with a
    LlamaIndex ``TokenCounter``'s ``estimate_tokens_in_messages``.

    Raises:
        ArgumentTypeError: ``counter`` is neither callable nor a ``TokenCounter``.
    """
    estimate = getattr(counter, "estimate_tokens_in_messages", None)
    if callable(estimate):
        return MessageCounter(estimate, _user_message, type(counter).__name__)
    if not callable(counter):
        raise ArgumentTypeError(
            f"counter: expected a callable over messages or a TokenCounter, got {counter!r:.80}"
        )
    return MessageCounter(counter, _user_message, getattr(counter, "__name__", "messages"))


def replaced(message: ChatMessage, text: str | None) -> ChatMessage:
    """``message`` as a window sends it, given its ``Window.replacement`` (``None``: as is).

    A tool result's only block becomes the placeholder text (``additional_kwargs`` kept);
    an assistant message whose calls are too large keeps its blocks with each call's
    arguments cut (:func:`demote.window.clearing.clip_calls`, ``text`` ending each cut
    value): ``ToolCallBlock`` and legacy ``ToolSelection`` or OpenAI-style calls alike,
    ids and names kept.
    """
    if text is None:
        return message
    if core_role(message) != "assistant":
        return message.model_copy(update={"blocks": [TextBlock(text=text)]})
    clipped = clip_calls(tool_calls(message), text)
    if clipped is None:
        return message
    args = {c["id"]: c["args"] for c in clipped if c.get("id")}
    blocks = [
        b.model_copy(update={"tool_kwargs": args[b.tool_call_id]})
        if isinstance(b, ToolCallBlock) and b.tool_call_id in args
        else b
        for b in message.blocks
    ]
    kwargs = dict(message.additional_kwargs)
    legacy = kwargs.get("tool_calls")
    if isinstance(legacy, list):
        kwargs["tool_calls"] = [_clipped_legacy(item, args) for item in legacy]
    return message.model_copy(update={"blocks": blocks, "additional_kwargs": kwargs})


def _clipped_legacy(item: Any, args: Mapping[str, Any]) -> Any:
    cid = _call_id(item)
    if cid is None or cid not in args:
        return item
    if isinstance(item, ToolSelection):
        return item.model_copy(update={"tool_kwargs": args[cid]})
    function = _field(item, "function")
    if isinstance(item, dict) and isinstance(function, dict):
        return {**item, "function": {**function, "arguments": json.dumps(args[cid])}}
    return item


def _user_message(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text=text)])


def from_core(role: Role | str, text: str) -> ChatMessage:
    """A LlamaIndex message with ``role`` and ``text`` (summary, recall, tests)."""
    return ChatMessage(role=MessageRole(role), blocks=[TextBlock(text=text)])


def recall_message(recalled: Sequence[Recalled], role: str = "user") -> ChatMessage:
    """The one message that carries recalled messages, oldest first.

    Args:
        recalled: What a recall returned (already filtered and cut to ``k``).
        role: ``"user"`` (what ``DemotingMemory`` sends by default) or ``"system"``.

    Returns:
        A message of :func:`demote.request.render_recall`: :data:`RECALL_PREFIX`, then
        one ``- role: text`` line each.
    """
    return from_core(role, render_recall(recalled))
