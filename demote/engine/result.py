"""What a load returns: the :class:`Window`, and how a running summary is shown in it.

Adapters render a :class:`Window` for their framework (see its docstring for the order);
the summary texts are the same in every adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from demote.events import DemoteEvent

__all__ = ["PROGRESS_PREFIX", "SUMMARY_PREFIX", "Window", "render_progress", "render_summary"]

T = TypeVar("T")

#: How adapters introduce the running summary to the model: a model's summary or the
#: note a cut left (either way, what the window no longer shows in full).
SUMMARY_PREFIX = "Earlier in this conversation (no longer shown in full):\n"

#: How adapters introduce the running summary when the window starts inside a turn: a
#: progress note on the task the opener set, sent with the opener (see :class:`Window`).
PROGRESS_PREFIX = "Earlier steps of this task (no longer shown in full):\n"


def render_summary(summary: str) -> str:
    """The text of the one system message that carries the running summary."""
    return SUMMARY_PREFIX + summary


def render_progress(summary: str) -> str:
    """The text of the progress note that carries the summary after a window's opener."""
    return PROGRESS_PREFIX + summary


@dataclass(frozen=True, slots=True)
class Window(Generic[T]):
    """What a load returns: the part of the history the model should see.

    Attributes:
        conversation_id: The conversation.
        pinned: Leading system messages (never demoted).
        summary: The committed running summary, or ``None``.
        messages: The kept messages, oldest first.
        start: Absolute index of ``messages[0]``.
        total: Length of the full history.
        demoted: Messages this call handed to the hook.
        pending: Messages that left the window but the hook has not accepted yet (they
            are retried with backoff; the inner store still has them).
        delivered: The hook's watermark: messages before it were accepted. It may run
            ahead of ``start``: cleared and clipped tool results in the window are handed
            to the hook before the model is sent their placeholders.
        events: What this load did (demoted, delivered, failed, re-synced, cleared,
            overhang, degraded), oldest first.
        degraded: The state store failed or was skipped (its breaker is open): the window
            was planned without it (from the history alone when even the read failed:
            the policy over a fresh state, pinned messages kept), and nothing was
            delivered or committed. ``pending`` and ``delivered`` are then as planned,
            not as committed. The next load after the store is back catches up.
        opener: When the window starts inside a turn (at a step boundary), the message
            that opened the turn, sent between the summary and ``messages`` so the model
            still sees the task (and every request starts with a user message); else
            ``None``. It is before ``start``: it was handed to the hook too. When it is
            over the clipping size, ``clipped[opener_index]`` is what it is sent as.
        opener_index: The opener's absolute index (recall skips it: the model sees it).
        placeholders: Absolute index -> the text the model is sent instead of that tool
            result's content (cleared: :func:`demote.window.clearing.placeholder_text`, naming
            the archived key). Adapters send a copy of the message with this content and
            everything else (call id, tool name, status, ids) kept.
        clipped: Absolute index -> the head of an oversized tool result and a placeholder
            for the rest (:func:`demote.window.clearing.clipped_text`), sent the same way;
            for an assistant message whose calls are too large, the marker that ends each
            of its cut argument values (:func:`demote.window.clearing.call_marker`):
            adapters send a copy whose calls are
            :func:`demote.window.clearing.clip_calls` of its calls (ids, names and
            argument keys kept) and whose text is unchanged; for an oversized opener, its
            head and tail around a marker naming its archived key
            (:func:`demote.window.clearing.user_clipped_text`), sent as its content.
        overhang: Tokens (in the policy's unit) by which what cannot be cut (pinned
            messages, the opener, the newest step after clipping) alone exceeds the
            limit; ``0`` when the window obeys it. An ``overhang`` event reports it.
        calls: ``False`` when no kept message opens a tool call, so there is nothing
            to pair with results: adapters skip looking for calls left unanswered
            (:func:`demote.window.pairing.unanswered`). ``True`` when one does, or may
            (a window not planned by the engine).

    How adapters render it for the model: ``pinned``, then the summary (one system
    message, :func:`render_summary`) unless there is an ``opener``, then the opener (its
    ``clipped`` text applied, if any), followed by the summary as a progress note
    (:func:`render_progress`) in a user message of its own (a system message
    mid-conversation is refused by some providers;
    kept apart, the opener stays byte-identical when the summary changes, so a prompt
    cache does not write it again), then ``messages`` with ``placeholders`` and
    ``clipped`` applied.
    """

    conversation_id: str
    pinned: list[T]
    summary: str | None
    messages: list[T]
    start: int
    total: int
    demoted: int = 0
    pending: int = 0
    delivered: int = 0
    events: tuple[DemoteEvent, ...] = ()
    opener: T | None = None
    placeholders: dict[int, str] = field(default_factory=dict)
    clipped: dict[int, str] = field(default_factory=dict)
    overhang: int = 0
    opener_index: int | None = None
    degraded: bool = False
    calls: bool = True

    def __len__(self) -> int:
        return len(self.pinned) + (self.opener is not None) + len(self.messages)

    def replacement(self, index: int) -> str | None:
        """The text sent instead of the content of the message at ``index``, if any.

        For an assistant message in ``clipped``: the marker of its cut calls (its content
        stays).
        """
        text = self.placeholders.get(index)
        return self.clipped.get(index) if text is None else text
