"""What the model is sent for a :class:`~demote.Window`, as LangChain messages.

:func:`render_window` is how :class:`~langchain_demote.DemotingChatMessageHistory` and
:class:`~langchain_demote.DemotingMiddleware` turn a window into messages;
:func:`answer_dangling` gives each call the conversation moved on from a stand-in result.
Both are re-exported by :mod:`langchain_demote.history`. Pure: the stored messages are
never changed.
"""

from __future__ import annotations

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from demote.engine import Window
from demote.request import Recalling, compose
from demote.window.pairing import UNANSWERED, unanswered
from langchain_demote.messages import replaced

__all__ = ["answer_dangling", "render_window"]


class _Renderer:
    """How a LangChain request gets what demote adds (:class:`demote.request.Renderer`)."""

    __slots__ = ("_recall",)

    def __init__(self, recall_role: str) -> None:
        self._recall = SystemMessage if recall_role == "system" else HumanMessage

    def note(self, text: str) -> BaseMessage:
        return HumanMessage(text)

    def recall(self, text: str) -> BaseMessage:
        return self._recall(text)

    def replaced(self, message: BaseMessage, text: str) -> BaseMessage:
        return replaced(message, text)

    def opens_calls(self, message: BaseMessage) -> bool:
        return isinstance(message, AIMessage) and bool(message.tool_calls)

    def answer_dangling(self, messages: list[BaseMessage]) -> list[BaseMessage]:
        return answer_dangling(messages)


_USER = _Renderer("user")
_SYSTEM = _Renderer("system")


def render_window(
    window: Window[BaseMessage],
    recalling: Recalling | None = None,
    *,
    recall_role: str = "user",
) -> list[BaseMessage]:
    """The messages the model is sent for a window (a new list).

    In order (:func:`demote.request.compose`, the same for every adapter): the pinned
    system messages; when the window starts inside a turn, the turn's opener as it is;
    the summary or digest as a note in a ``HumanMessage`` of its own (never a system
    message: some providers take those only at the start, others merge them into the
    system block, which would then change at every cut; kept apart, the opener stays
    byte-identical when the note changes, and the providers' converters merge two user
    messages in a row into one turn); the kept messages, each cleared or clipped tool
    result as a copy whose content is the placeholder text (``tool_call_id``, ``name``,
    ``artifact``, ``status`` and ``id`` kept), each assistant message whose calls are
    too large as a copy with its long argument values cut
    (:func:`~langchain_demote.messages.replaced`); and with ``recalling``, one message of
    recalled archive messages right after the question. The stored messages are never
    changed.

    Args:
        window: What :meth:`demote.Demoter.load` returned.
        recalling: What recall places in the request (:func:`demote.request.recall_flow`).
        recall_role: ``"user"`` (a ``HumanMessage``) or ``"system"``.
    """
    return compose(window, _SYSTEM if recall_role == "system" else _USER, recalling)


def answer_dangling(messages: list[BaseMessage]) -> list[BaseMessage]:
    """``messages`` with a stand-in result for each call that is never answered.

    Providers refuse a tool call without its result once the conversation has moved on
    (a human-in-the-loop interrupt the user abandoned, then a new question). Each such
    call gets a :data:`~demote.window.pairing.UNANSWERED` ``ToolMessage``
    (``status="error"``) right after the results its message did get
    (:func:`demote.window.pairing.unanswered`); a call at the very end (about to run) is
    left alone. The list is returned as is when nothing dangles; the stored messages are
    never changed.
    """
    for m in messages:  # most windows have no calls at all: one cheap pass says so
        if isinstance(m, AIMessage) and m.tool_calls:
            break
    else:
        return messages
    opens: list[tuple[str, ...]] = []
    answers: list[str | None] = []
    for m in messages:
        if isinstance(m, AIMessage):
            calls = m.tool_calls
            opens.append(tuple([c.get("id") or "" for c in calls]) if calls else ())
            answers.append(None)
        else:
            opens.append(())
            answers.append(m.tool_call_id if isinstance(m, ToolMessage) else None)
    gaps = unanswered(opens, answers)
    if not gaps:
        return messages
    names: dict[str, str] = {}  # (only needed for a stand-in: most windows have none)
    for m in messages:
        if isinstance(m, AIMessage):
            names.update((c.get("id") or "", c["name"]) for c in m.tool_calls)
    out: list[BaseMessage] = []
    done = 0
    for at, missing in gaps:
        out.extend(messages[done:at])
        out.extend(
            ToolMessage(UNANSWERED, tool_call_id=c, name=names.get(c), status="error")
            for c in missing
        )
        done = at
    out.extend(messages[done:])
    return out
