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

from demote.engine import Window, render_progress, render_summary
from demote.window.pairing import UNANSWERED, unanswered
from langchain_demote.messages import replaced

__all__ = ["answer_dangling", "render_window"]


def render_window(window: Window[BaseMessage]) -> list[BaseMessage]:
    """The messages the model is sent for a window (a new list).

    In order: the pinned system messages; the running summary as one ``SystemMessage``
    when the window starts at a turn; or, when it starts inside a turn, the turn's opener
    as it is, then the summary (of the earlier steps) as a progress note in a
    ``HumanMessage`` of its own (a system message mid-conversation is refused by some
    providers; the opener stays byte-identical, so a new summary or digest does not make
    the cache write the opener again; the providers' converters merge two user messages
    in a row into one turn); then the kept messages, each
    cleared or clipped tool result as a copy whose content is the placeholder text
    (``tool_call_id``, ``name``, ``artifact``, ``status`` and ``id`` kept), each assistant
    message whose calls are too large as a copy with its long argument values cut
    (:func:`~langchain_demote.messages.replaced`). The stored messages are never changed.

    Args:
        window: What :meth:`demote.Demoter.load` returned.
    """
    out = list(window.pinned)
    summary, opener = window.summary, window.opener
    if opener is None:
        if summary is not None:
            out.append(SystemMessage(render_summary(summary)))
    else:
        out.append(opener)
        if summary is not None:
            out.append(HumanMessage(render_progress(summary)))
    if not (window.placeholders or window.clipped):
        out.extend(window.messages)
    else:
        out.extend(
            replaced(m, window.replacement(i)) for i, m in enumerate(window.messages, window.start)
        )
    return answer_dangling(out) if window.calls else out


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
