"""A Demoter's notes: what a load's summary costs, and the note a cut leaves behind.

:class:`Notes` holds what :class:`~demote.engine._planning.Planning` needs of the
committed summary (the note a :class:`~demote.window.policy.LowWater` cut left, or a
``Compact`` summary) and nothing that does I/O: its tokens as sent, which count toward a
token limit (:meth:`Notes.with_summary`), and the note the next cut makes of the steps it
drops (:meth:`Notes.after_cut`), with the calls those steps made read from the messages.
The room that note has is decided in the window (:func:`demote.window.steps.digest_room`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from demote.engine.result import render_progress, render_summary
from demote.records import ConversationState, MessageRecord, fingerprint
from demote.window.digest import DroppedCall, make_digest
from demote.window.policy import SlidingWindow
from demote.window.steps import digest_room, digest_tokens
from demote.window.tokens import MessageCounter, TokenCache, approximate_tokens

__all__ = ["Notes"]

logger = logging.getLogger("demote")

_SUMMARIES_KEPT = 1024  # summaries whose count is kept (a few per conversation at most)


def _calls(
    dropped: Sequence[MessageRecord], messages: Sequence[Any], lo: int
) -> list[tuple[DroppedCall, ...]] | None:
    """The tool calls of each dropped record (``messages[lo + i]``), from its neutral form.

    ``None`` when the messages are not at hand; a record without ``to_data`` has none.
    """
    if len(messages) < lo + len(dropped):
        return None
    out: list[tuple[DroppedCall, ...]] = []
    for i, rec in enumerate(dropped):
        if not rec.opens or rec.to_data is None:
            out.append(())
            continue
        try:
            data = rec.to_data(messages[lo + i])
            calls = tuple(
                DroppedCall(str(c.get("id") or ""), str(c.get("name") or ""), _args(c.get("args")))
                for c in data.get("tool_calls") or ()
                if isinstance(c, dict)
            )
        except Exception:  # the note is a help: a message it cannot read leaves no trail
            logger.debug("demote: no trail for message %d", lo + i, exc_info=True)
            calls = ()
        out.append(calls)
    return out


def _args(args: object) -> dict[str, object]:
    """A call's arguments as a mapping (a provider's raw string kept under ``args``)."""
    if isinstance(args, dict):
        return dict(args)
    return {} if args is None else {"args": args}


class Notes:
    """Counts the committed summary and makes the note of a cut (no I/O; one per Demoter).

    Attributes:
        share: Tokens the policy sets aside for the note of dropped steps (``0``: it
            makes none; :func:`~demote.window.steps.digest_tokens`).
    """

    def __init__(self, policy: SlidingWindow, tokens: TokenCache) -> None:
        self.policy = policy
        self.tokens = tokens
        self.share = digest_tokens(policy)
        # A summary's count by its text: a load would otherwise render and hash it twice.
        self._summaries: dict[str, int] = {}
        text_counter = policy.resolved_counter()
        # The digest's pieces are counted one by one, at a cut: a counter of whole
        # framework messages would cost a model call each, so those are approximated.
        self._count_text: Callable[[str], int] = (
            approximate_tokens if isinstance(text_counter, MessageCounter) else text_counter
        )

    def with_summary(self, state: ConversationState, reserved: int) -> int:
        """``reserved`` plus the committed summary's tokens in a token window.

        The summary is sent too (a system message, or the opener's progress note), so it
        counts toward the limit like the rest of the request.
        """
        if state.summary is None or self.policy.unit != "tokens":
            return reserved
        return reserved + self.summary_tokens(state.summary)

    def summary_tokens(self, summary: str) -> int:
        """What ``summary`` costs as sent, whichever form is larger.

        A system message, or the progress note after an opener (a user message with its
        own lead): the plan decides which after the summary is counted.
        """
        known = self._summaries.get(summary)
        if known is not None:  # every load of an agent's window between cuts
            return known
        tokens = self.tokens
        text = render_summary(summary)
        as_system = tokens.count(fingerprint("system", text), text, role="system")
        note = render_progress(summary)
        as_note = tokens.count(fingerprint("user", note), note, role="user")
        if len(self._summaries) >= _SUMMARIES_KEPT:
            self._summaries.clear()
        self._summaries[summary] = counted = max(as_system, as_note)
        return counted

    def after_cut(
        self,
        summary: str | None,
        dropped: Sequence[MessageRecord],
        messages: Sequence[Any],
        lo: int,
        size: int,
    ) -> str | None:
        """The note after a cut that drops ``dropped`` (``messages[lo:]``'s records).

        Within the room :func:`~demote.window.steps.digest_room` gives it: the note's
        share, and what the limit leaves once the plan's window (of ``size``, which
        counted the old note) is sent: never over the limit for it.
        """
        had = self.summary_tokens(summary) if summary is not None else 0
        budget = digest_room(self.policy, size, had)
        calls = _calls(dropped, messages, lo)
        return make_digest(summary, dropped, budget, self._count_text, calls)
