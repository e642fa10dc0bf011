"""What a ``DemotingMemory`` read returns: the window, with recall placed next to the question.

Pure functions over the engine's :class:`~demote.engine.Window` (no I/O):
:func:`assemble` builds the list (pinned, summary, kept messages, one recall message),
:class:`Parts` bundles what the memory's hot path needs in one attribute.

When the window starts inside a turn (a long agent run put into memory), the turn's
opener comes right after the pinned messages and the running summary is appended to a
copy of it as one more text block, a progress note (not a system message mid-
conversation, which some providers refuse, nor a second user message in a row, which
others refuse). Cleared and clipped tool results are sent as copies whose only block is
the placeholder text; their ``additional_kwargs`` (``tool_call_id``, ``name``) stay. An
assistant message whose calls are too large is sent with its long argument values cut
(:func:`~llamaindex_demote.messages.replaced`). The chat store's messages are never changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock

from demote.engine import Demoter, Window, render_progress, render_summary
from demote.events import DemoteEvent
from demote.hooks.base import Capture, Recall
from demote.records import MessageRecord, Recalled
from demote.window.pairing import UNANSWERED, unanswered
from llamaindex_demote.instrumentation import emit_events
from llamaindex_demote.messages import (
    answered_call,
    core_role,
    from_core,
    opened_calls,
    recall_message,
    replaced,
    text_of,
    tool_calls,
)

__all__ = ["Parts", "assemble"]


def _recall_point(messages: Sequence[ChatMessage], query: str | None) -> tuple[str | None, int]:
    """The recall query and where its message goes in the kept ``messages``.

    Without ``query`` the newest stored user message is the query and recall goes right
    before it. With ``query``, recall goes before the newest message if that is the same
    user message (already stored), else at the end (the engine appends the question).
    """
    newest = next(
        (i for i in range(len(messages) - 1, -1, -1) if core_role(messages[i]) == "user"),
        None,
    )
    if query is None:
        if newest is None:
            return None, len(messages)
        return text_of(messages[newest]) or None, newest
    last = len(messages) - 1
    if newest == last and text_of(messages[last]) == query:
        return query, last
    return query, len(messages)


def shown(window: Window[ChatMessage]) -> list[ChatMessage]:
    """The conversation's messages sent after the pinned ones, as stored.

    The opener (if the window starts inside a turn), then the kept messages.
    """
    if window.opener is None:
        return window.messages
    return [window.opener, *window.messages]


def _visible(window: Window[ChatMessage], recalled: Sequence[Recalled], k: int) -> list[Recalled]:
    """The first ``k`` recalled messages the model does not already see in ``window``."""
    pinned = len(window.pinned)
    seen: set[tuple[str, str]] | None = None  # only hits without an index need it
    out = []
    for r in recalled:
        if r.index >= 0:
            if r.index >= window.start or r.index < pinned or r.index == window.opener_index:
                continue
        else:
            if seen is None:
                seen = {(core_role(m), text_of(m)) for m in (*window.pinned, *shown(window))}
            if (r.role, r.text) in seen:
                continue
        out.append(r)
        if len(out) == k:
            break
    return out


def _body(window: Window[ChatMessage]) -> list[ChatMessage]:
    """:func:`shown` as the model is sent it: progress note, placeholders applied."""
    body = shown(window)
    opener, summary = window.opener, window.summary
    if opener is not None and summary:
        # The opener as it is, then the note as a user message of its own (see
        # langchain_demote._rendering.render_window: the opener stays byte-identical).
        note = ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text=render_progress(summary))])
        body = [opener, note, *window.messages]
    if not (window.placeholders or window.clipped):
        return body
    out = body[: len(body) - len(window.messages)]
    out.extend(
        replaced(m, window.replacement(i)) for i, m in enumerate(window.messages, window.start)
    )
    return out


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


def assemble(
    window: Window[ChatMessage],
    recalled: Sequence[Recalled] = (),
    at: int = 0,
) -> list[ChatMessage]:
    """A new list: pinned, summary, the shown messages, the recall message inserted at ``at``.

    ``at`` indexes :func:`shown` (opener first, when there is one). Calls the conversation
    moved on from get their stand-in results (:func:`answer_dangling`), when a kept
    message opens one (``Window.calls``: the opener, the summary and the recall message
    open none).
    """
    body = window.messages
    if recalled or window.opener is not None or window.placeholders or window.clipped:
        body = _body(window)
        if recalled:
            if at and window.opener is not None and window.summary:
                at += 1  # the progress note follows the opener in the body, not in shown()
            body = [*body[:at], recall_message(recalled), *body[at:]]
    if window.calls:
        body = answer_dangling(body)
    if window.summary and window.opener is None:
        return [*window.pinned, from_core("system", render_summary(window.summary)), *body]
    return window.pinned + body


@dataclass(frozen=True, slots=True)
class Parts:
    """What the memory's hot path uses, read with one lookup (see ``DemotingMemory._p``)."""

    demoter: Demoter
    describe: Callable[[ChatMessage], MessageRecord]  # to_core bound to demoter.describe
    recall: Recall | None
    recall_k: int
    capture: Capture | None
    recall_budget_tokens: int | None = None

    def search_options(self) -> dict[str, int]:
        """Keyword arguments of a recall search (only what was asked for)."""
        budget = self.recall_budget_tokens
        return {} if budget is None else {"budget_tokens": budget}

    def recall_query(
        self, window: Window[ChatMessage], input: str | None
    ) -> tuple[Recall, str, int] | None:
        """The recall, its query and where its message goes; ``None`` when nothing to ask."""
        if self.recall is None:
            return None
        query, at = _recall_point(shown(window), input)
        return (self.recall, query, at) if query else None

    def recalled(
        self, window: Window[ChatMessage], hits: Sequence[Recalled], at: int, took: float
    ) -> list[ChatMessage]:
        """The messages to send: the window, with the hits it does not show at ``at``.

        The recall is reported (a ``recalled`` event of what the model is sent, to
        LlamaIndex's instrumentation and the Demoter's observers).
        """
        shown = _visible(window, hits, self.recall_k)
        event = DemoteEvent.recalled(window.conversation_id, shown, took)
        self.demoter.emit(event)
        emit_events((event,))
        return assemble(window, shown, at)
