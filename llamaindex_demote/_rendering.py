"""What a ``DemotingMemory`` read returns: the window, as the request's messages.

Pure functions over the engine's :class:`~demote.engine.Window` (no I/O): :func:`assemble`
builds the list with :func:`demote.request.compose`, the order every adapter sends
(pinned, the opener when the window starts inside a turn, the summary or digest as a user
message of its own, the kept messages, one recall message right after the question);
:class:`Parts` bundles what the memory's hot path needs in one attribute.

Cleared and clipped tool results are sent as copies whose only block is the placeholder
text; their ``additional_kwargs`` (``tool_call_id``, ``name``) stay. An assistant message
whose calls are too large is sent with its long argument values cut
(:func:`~llamaindex_demote.messages.replaced`). The chat store's messages are never
changed. demote adds no system message: a chat engine's or agent's system prompt stays
the only system block, and it never changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock

from demote.engine import Demoter, Window
from demote.hooks.base import Capture, Recall
from demote.records import MessageRecord
from demote.request import Extra, Recalling, RecallMemo, RecallSettings, compose
from demote.window.pairing import UNANSWERED, unanswered
from llamaindex_demote._block_slots import BlockSettings
from llamaindex_demote.messages import (
    answered_call,
    from_core,
    opened_calls,
    replaced,
    tool_calls,
)

__all__ = ["Parts", "assemble"]


class _Renderer:
    """How a LlamaIndex request gets what demote adds (:class:`demote.request.Renderer`)."""

    __slots__ = ("_recall_role",)

    def __init__(self, recall_role: str) -> None:
        self._recall_role = recall_role

    def note(self, text: str) -> ChatMessage:
        return ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text=text)])

    def recall(self, text: str) -> ChatMessage:
        return from_core(self._recall_role, text)

    def replaced(self, message: ChatMessage, text: str) -> ChatMessage:
        return replaced(message, text)

    def opens_calls(self, message: ChatMessage) -> bool:
        return bool(opened_calls(message))

    def answer_dangling(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        return answer_dangling(messages)


_USER = _Renderer("user")
_SYSTEM = _Renderer("system")


def assemble(
    window: Window[ChatMessage],
    recalling: Recalling | None = None,
    recall_role: str = "user",
    extra: Extra[ChatMessage] | None = None,
) -> list[ChatMessage]:
    """A new list: the request's messages for ``window`` (:func:`demote.request.compose`).

    ``extra`` holds the memory blocks' messages. Calls the conversation moved on from get
    their stand-in results (:func:`answer_dangling`) when a kept message opens one
    (``Window.calls``).
    """
    return compose(window, _SYSTEM if recall_role == "system" else _USER, recalling, extra)


@dataclass(frozen=True, slots=True)
class Parts:
    """What the memory's hot path uses, read with one lookup (see ``DemotingMemory._p``).

    ``recall``, ``recall_k``, ``recall_budget_tokens`` and ``recall_role`` are the options
    as given (saved by :mod:`llamaindex_demote.persist`); ``recalling`` is what they mean
    for this demoter's policy, ``memo`` each conversation's newest recall. ``blocks`` are
    the memory blocks, if any (:mod:`llamaindex_demote._block_slots`).
    """

    demoter: Demoter
    describe: Callable[[ChatMessage], MessageRecord]  # to_core bound to demoter.describe
    recall: Recall | None
    recall_k: int
    capture: Capture | None
    recall_budget_tokens: int | None = None
    recall_role: str = "user"
    blocks: BlockSettings | None = None
    recalling: RecallSettings | None = field(init=False, default=None)
    memo: RecallMemo = field(init=False, default_factory=RecallMemo)

    def __post_init__(self) -> None:
        settings = RecallSettings.make(
            self.recall,
            self.recall_k,
            self.recall_budget_tokens,
            self.recall_role,
            self.demoter.policy,
        )
        object.__setattr__(self, "recalling", settings)

    def recall_tokens(self, text: str) -> int:
        """What the recall message with ``text`` costs as sent (the window's own count)."""
        role = (
            "system" if self.recalling is not None and self.recalling.role == "system" else "user"
        )
        return self.describe(from_core(role, text)).tokens

    def message_tokens(self, message: ChatMessage) -> int:
        """What ``message`` costs as sent (the window's own count)."""
        return self.describe(message).tokens

    def reserve(self) -> int:
        """Tokens the window leaves free for the recall message and the memory blocks."""
        recall = 0 if self.recalling is None else self.recalling.reserve
        return recall + (0 if self.blocks is None else self.blocks.reserve())

    def render(
        self,
        window: Window[ChatMessage],
        recalling: Recalling | None,
        extra: Extra[ChatMessage] | None = None,
    ) -> list[ChatMessage]:
        """The request's messages for ``window`` with what recall and the blocks found."""
        role = "user" if self.recalling is None else self.recalling.role
        return assemble(window, recalling, role, extra)


def answer_dangling(messages: list[ChatMessage]) -> list[ChatMessage]:
    """``messages`` with a stand-in result for each call that is never answered.

    A call the conversation moved on from (an abandoned human-in-the-loop interrupt, a
    run that died between the call and its tool) gets a tool message of
    :data:`~demote.window.pairing.UNANSWERED`, with its ``tool_call_id`` and tool
    ``name`` (how LlamaIndex's LLM integrations read a result), right after the results
    its message did get (:func:`demote.window.pairing.unanswered`). The list is returned
    as is when nothing dangles; the stored messages are never changed.
    """
    for m in messages:  # most windows have no calls at all: one cheap pass says so
        blocks = m.blocks
        if "tool_calls" in m.additional_kwargs or not (
            len(blocks) == 1 and type(blocks[0]) is TextBlock
        ):
            break
    else:
        return messages
    opens = [opened_calls(m) for m in messages]
    if not any(opens):
        return messages
    gaps = unanswered(opens, [answered_call(m) for m in messages])
    if not gaps:
        return messages
    names = {c["id"]: c.get("name") for m in messages for c in tool_calls(m) if c.get("id")}
    out: list[ChatMessage] = []
    done = 0
    for at, missing in gaps:
        out.extend(messages[done:at])
        out.extend(
            ChatMessage(
                role=MessageRole.TOOL,
                content=UNANSWERED,
                additional_kwargs={"tool_call_id": c, "name": names.get(c) or ""},
            )
            for c in missing
        )
        done = at
    out.extend(messages[done:])
    return out
