"""How the request's messages are put together, in their order: :func:`compose`.

:func:`compose` builds what one model call is sent from a
:class:`~demote.engine.result.Window`, with what it takes: the adapter's
:class:`Renderer`, what recall places (:class:`Recalling`), the adapter's own
:class:`Extra` messages, and the note's text (:func:`note_text`). All pure. The order, and
the rules it keeps, are told in :mod:`demote.request`, which exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from demote.engine import Window, render_progress, render_summary
from demote.records import Recalled

__all__ = ["Extra", "Recalling", "Renderer", "compose", "note_text"]

T = TypeVar("T")


def note_text(window: Window[Any]) -> str | None:
    """The text of the note the model is sent after the opener (or the pinned messages).

    ``None`` without a committed summary. The note is a user message of its own in every
    adapter: never a system message (some providers take those only at the start, and
    others merge them into the system block, which would change it at every cut).
    """
    summary = window.summary
    if not summary:
        return None
    return render_progress(summary) if window.opener is not None else render_summary(summary)


class Renderer(Protocol[T]):
    """How one framework makes the messages :func:`compose` adds (its adapter's part)."""

    def note(self, text: str) -> T:
        """A user message carrying ``text`` (the summary or digest)."""

    def recall(self, text: str) -> T:
        """The recall message (a user message, or a system one when asked for)."""

    def replaced(self, message: T, text: str) -> T:
        """A copy of ``message`` sent with ``text`` instead of its content.

        ``text`` is a placeholder or a clipped head, or for an assistant message the
        marker of its cut calls.
        """

    def opens_calls(self, message: T) -> bool:
        """Does ``message`` open tool calls?"""

    def answer_dangling(self, messages: list[T]) -> list[T]:
        """``messages`` with a stand-in result after each call left unanswered."""


@dataclass(frozen=True, slots=True)
class Recalling:
    """What recall places in one request.

    Attributes:
        text: The recall message's text (:func:`render_recall` of ``hits``).
        hits: The recalled messages it carries, best first.
        after: Absolute index of the message it follows (the question), or ``None``
            when the question is not stored yet: it then goes at the end.
    """

    text: str
    hits: tuple[Recalled, ...]
    after: int | None


@dataclass(frozen=True, slots=True)
class Extra(Generic[T]):
    """Messages an adapter adds to a request besides the note and recall.

    Each slot is for content that changes at one pace (see :mod:`demote.request`), so
    that placing it there breaks no more of a prompt cache than the request's own
    parts already do. All are user messages: demote never adds a system message.

    Attributes:
        head: Content that never changes: right after the pinned system messages, before
            the opener.
        noted: Content that changes when what left the window is fed to it: right after
            the note (after the opener when there is no note).
        asked: Content that answers the question: right after it (after the recall).
        after: Absolute index of the question ``asked`` follows, or ``None`` when it is
            not stored yet: ``asked`` then goes at the end. Ignored when there is a
            recall (it goes after the recall's question).
    """

    head: tuple[T, ...] = ()
    noted: tuple[T, ...] = ()
    asked: tuple[T, ...] = ()
    after: int | None = None


def compose(
    window: Window[T],
    renderer: Renderer[T],
    recalling: Recalling | None = None,
    extra: Extra[T] | None = None,
) -> list[T]:
    """The request's messages for ``window`` (a new list; stored messages are never changed).

    In order: the pinned system messages, ``extra.head``, the opener (when the window
    starts inside a turn), the note (:func:`note_text`), ``extra.noted``, the kept
    messages with placeholders and clipped calls applied, and the recall message and
    ``extra.asked`` right after the question (after the note when the question is the
    opener; at the end when the question is not stored). Calls the conversation moved
    on from get their stand-in results when a kept message opens one.

    Args:
        window: What :meth:`demote.Demoter.load` returned.
        renderer: The adapter's message makers.
        recalling: What :func:`recall_flow` found, if anything.
        extra: The adapter's own additions, if any.
    """
    out = list(window.pinned)
    if extra is not None:
        out.extend(extra.head)
    opener = window.opener
    if opener is not None:
        clipped = (
            window.clipped.get(window.opener_index) if window.opener_index is not None else None
        )
        out.append(opener if clipped is None else renderer.replaced(opener, clipped))
    note = note_text(window)
    if note is not None:
        out.append(renderer.note(note))
    if extra is not None:
        out.extend(extra.noted)
    head = len(out)
    if window.placeholders or window.clipped:
        replacement = window.replacement
        for i, m in enumerate(window.messages, window.start):
            text = replacement(i)
            out.append(m if text is None else renderer.replaced(m, text))
    else:
        out.extend(window.messages)
    asked: list[T] = []
    after = None if extra is None else extra.after
    if recalling is not None:
        asked.append(renderer.recall(recalling.text))
        after = recalling.after
    if extra is not None:
        asked.extend(extra.asked)
    if asked:
        if after is not None and after == window.opener_index:
            at = head
        elif after is not None and window.start <= after < window.total:
            at = head + after - window.start + 1
        else:
            at = len(out)
        # Never between a call and its results (a question is a user message; only a
        # recall placed at the end can follow a call that is about to run).
        while at > head and renderer.opens_calls(out[at - 1]):
            at -= 1
        out[at:at] = asked
    if window.calls:
        out = renderer.answer_dangling(out)
    return out
