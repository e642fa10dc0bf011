"""What a ``DemotingMemory`` read returns: the window, with recall placed next to the question.

Pure functions over the engine's :class:`~demote.engine.Window` (no I/O):
:func:`assemble` builds the list (pinned, summary, kept messages, one recall message),
:class:`Parts` bundles what the memory's hot path needs in one attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llama_index.core.base.llms.types import ChatMessage

from demote.engine import Demoter, Window, render_summary
from demote.events import DemoteEvent
from demote.hooks.base import Capture, Recall
from demote.records import MessageRecord, Recalled
from llamaindex_demote.instrumentation import emit_events
from llamaindex_demote.messages import core_role, from_core, recall_message, text_of

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


def _visible(window: Window[ChatMessage], recalled: Sequence[Recalled], k: int) -> list[Recalled]:
    """The first ``k`` recalled messages the model does not already see in ``window``."""
    pinned = len(window.pinned)
    shown: set[tuple[str, str]] | None = None  # only hits without an index need it
    out = []
    for r in recalled:
        if r.index >= 0:
            if r.index >= window.start or r.index < pinned:
                continue
        else:
            if shown is None:
                shown = {(core_role(m), text_of(m)) for m in (*window.pinned, *window.messages)}
            if (r.role, r.text) in shown:
                continue
        out.append(r)
        if len(out) == k:
            break
    return out


def assemble(
    window: Window[ChatMessage], recalled: Sequence[Recalled] = (), at: int = 0
) -> list[ChatMessage]:
    """A new list: pinned, summary, kept messages, with the recall message inserted at ``at``."""
    body = window.messages
    if recalled:
        body = [*body[:at], recall_message(recalled), *body[at:]]
    if window.summary:
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
        query, at = _recall_point(window.messages, input)
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
