"""A Demoter's planning part: plan a load against the committed state, build its Window.

:class:`Planning` holds what planning needs (the policy, the per-conversation views, the
token cache, the tally, the :class:`~demote.engine._notes.Notes`) and nothing that does
I/O: it turns a history and the committed state into the
:class:`~demote.engine._work.Work` a load delivers and commits
(:meth:`Planning.prepare`), or the window of a stale copy, or of a history planned
without the store (:meth:`Planning.from_history`), and builds the
:class:`~demote.engine.result.Window` a load returns (:meth:`Planning.window`), with the
events of what it committed.
"""

from __future__ import annotations

import logging
import operator
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from demote._built import unchecked
from demote.engine._notes import Notes
from demote.engine._views import (
    View,
    ViewCache,
    after_pruned,
    record_at,
    replaced_texts,
    snapshot_plan,
    trail_at,
)
from demote.engine._work import FRESH, Tally, Work
from demote.engine.result import Window
from demote.events import DemoteEvent
from demote.records import ConversationState, MessageRecord, make_key
from demote.window.clearing import ResultCosts, fitting_chars
from demote.window.planner import Plan, needed_from, plan
from demote.window.policy import Compact, SlidingWindow
from demote.window.steps import result_costs
from demote.window.tokens import TokenCache

__all__ = ["Planning"]

logger = logging.getLogger("demote")

_TOKENS = operator.attrgetter("tokens")  # summed without a Python frame per record
_new_window = unchecked(Window)  # every load makes one, of values checked here
_new_state = unchecked(ConversationState)  # every move of the window: its plan's values
_new_event = unchecked(DemoteEvent)  # every move's ``demoted`` event

T = TypeVar("T")


def _stored_tokens(work: Work, old: int, new: int) -> tuple[int, int]:
    """Tokens from ``old`` and from ``new`` to the end, as the messages are stored.

    From the plan's index when both are cuts of it and nothing in it is counted clipped
    (then each message counts what it is stored as): two lookups, not a pass.
    """
    idx = work.plan.index
    if idx is not None and not idx.clip_pos and idx.end == len(work.messages):
        cuts = idx.cuts
        i, j = bisect_left(cuts, old), bisect_left(cuts, new)
        if j < len(cuts) and cuts[i] == old and cuts[j] == new:
            return idx.tokens - idx.cuts_at[i], idx.tokens - idx.cuts_at[j]
    records, base = work.view.records, work.view.base
    after = sum(map(_TOKENS, records[new - base :]))
    return after + sum(map(_TOKENS, records[old - base : new - base])), after


class Planning:
    """Plans each load and builds the window it returns (no I/O; one per Demoter)."""

    def __init__(
        self,
        policy: SlidingWindow,
        views: ViewCache,
        tokens: TokenCache,
        tally: Tally,
        *,
        noop: bool,
        summarizer: object | None,
    ) -> None:
        self.policy = policy
        self.tokens = tokens
        self._views = views
        self._tally = tally
        self._noop = noop  # the hook keeps nothing: it accepts everything at once
        self._summarizer = summarizer
        self._notes = Notes(policy, tokens)

    def from_history(
        self,
        cid: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
        reserved: int = 0,
        pruned: range = range(0),
        fixed: int = 0,
    ) -> Window[T]:
        """The window of ``messages`` planned from a fresh state (the store is unreadable).

        With ``pruned`` positions absent, from the state they imply instead
        (:func:`~demote.engine._views.after_pruned`).
        """
        seeded, lo, pinned_tokens = after_pruned(messages, describe, pruned)
        state = seeded or FRESH
        view = self._views.records(cid, messages, lo, describe)
        p = plan(
            self.policy,
            state,
            view.records,
            base=lo,
            reserved=reserved,
            pinned_tokens=pinned_tokens,
            fixed=fixed,
        )
        target = self._advance(state, p, view, messages)
        work = Work(
            messages,
            None,
            p,
            view,
            target,
            False,
            False,
            reserved=reserved,
            describe=describe,
            fixed=fixed,
        )
        return self.window(cid, work)

    def committed(self, cid: str, work: Work, committed: ConversationState) -> None:
        """Events for a committed window move (and a committed re-sync)."""
        prev = work.stored or FRESH
        if work.resynced:
            with self._tally.lock:
                self._tally.resyncs += 1
            work.events.insert(
                0,
                DemoteEvent(
                    "resynced", cid, prev.window_start, len(work.messages), len(work.messages)
                ),
            )
            prev = FRESH
        old = prev.window_start if prev.window_start > prev.pinned else work.plan.pinned
        new = committed.window_start
        if new > old:
            # The kept messages as stored (a plan's size may count pinned messages, the
            # opener, reserved tokens or placeholders too).
            before, after = _stored_tokens(work, max(old, work.view.base), new)
            at = 1 if work.resynced else 0
            work.events.insert(
                at, _new_event("demoted", cid, old, new, new - old, (), before, after)
            )
        if work.plan.placeholders or work.plan.clipped:
            cleared = self._cleared_event(cid, work, prev)
            if cleared is not None:
                work.events.append(cleared)

    def _cleared_event(self, cid: str, work: Work, prev: ConversationState) -> DemoteEvent | None:
        """``cleared``: tool results this commit first sends as placeholders (or clipped)."""
        p = work.plan
        fresh = [i for i in p.placeholders if i >= prev.cleared]
        clipped = [i for i in p.clipped if i >= prev.delivered]
        if not (fresh or clipped):
            return None
        records, base = work.view.records, work.view.base
        indexes = sorted((*fresh, *clipped))
        before = sum(records[i - base].tokens for i in indexes)
        costs = _costs_of(self.policy, work)  # placeholders, clipped heads, cut calls
        after = sum(costs.placeholder(records[i - base]) for i in fresh) + sum(
            costs.cost(records[i - base]) for i in clipped
        )
        keys = tuple(make_key(cid, i, records[i - base].fingerprint) for i in indexes)
        return DemoteEvent(
            "cleared", cid, indexes[0], indexes[-1] + 1, len(indexes), keys, before, after
        )

    def _overhang_event(self, cid: str, work: Work) -> DemoteEvent:
        """``overhang``: what cannot be cut alone exceeds the limit (every such load)."""
        p = work.plan
        return DemoteEvent(
            "overhang",
            cid,
            p.window_start,
            p.end,
            p.end - p.window_start,
            tokens_before=p.size,
            tokens_after=p.overhang,
        )

    def _chars(self, text: str, tokens: int, from_end: bool) -> int:
        """How many leading (or trailing) characters of ``text`` fit in ``tokens``."""
        return fitting_chars(self.policy.resolved_counter(), text, tokens, from_end)

    def prepare(
        self,
        cid: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
        stored: ConversationState | None,
        reserved: int = 0,
        pruned: range = range(0),
        fixed: int = 0,
    ) -> Work | Window[T]:
        """Plan ``messages`` against ``stored``: the work to do, or a stale copy's window.

        ``pruned``: positions absent after the pinned head (an agent state whose front was
        pruned): a plan that needs records from further back than the state checks reads
        from their end, not below (see :meth:`Demoter.load`).
        """
        state = stored or FRESH
        given = reserved
        if state.summary is not None:
            reserved = self._notes.with_summary(state, reserved)
        if self._views.is_stale(cid, messages, describe, state):
            # A request that read the history before a newer one appended to it: not a
            # rewrite, and not the current history either. Serve it its own window
            # (planned, bounded, placeholders and all), change nothing.
            p, view, summary = snapshot_plan(
                self.policy, messages, describe, state, reserved, pruned, fixed
            )
            stale = Work(
                messages,
                stored,
                p,
                view,
                state,
                False,
                False,
                reserved=given,
                describe=describe,
                fixed=fixed,
            )
            return self.window(cid, stale, replace(state, summary=summary))
        view = self._views.records(cid, messages, needed_from(state), describe)
        index = view.index
        if index is not None and state.window_start > state.pinned:
            # The opener is shown, but it is before what the state checks (the anchor):
            # an edit of it changes what the window costs. Plan it afresh, then.
            at, tokens = index.opener_at(state.window_start)
            if (
                at is not None
                and at < len(messages)
                and index.costs.opener(record_at(view, messages, at, describe)) != tokens
            ):
                view.index = None
        pinned_tokens = None
        if (
            (view.index is None or self.policy.unit == "tokens")
            and view.base > 0
            and not state.offset
            and 0 < state.pinned <= len(messages)
        ):
            # Records read from past the pinned head (a restart, a first load in this
            # process): their tokens count toward a token limit all the same. The head is
            # shown but lies before what the state checks, so a token window counts it
            # from the messages on every load: an edited system prompt counts as it is.
            pinned_tokens = sum(
                record_at(view, messages, i, describe).tokens for i in range(state.pinned)
            )
        p = plan(
            self.policy,
            state,
            view.records,
            base=view.base,
            index=view.index,
            reserved=reserved,
            pinned_tokens=pinned_tokens,
            fixed=fixed,
        )
        if p.needs is not None and not p.rewritten:
            # The window starts inside a turn whose opener is before what was read (the
            # state does not store where it is: after a restart, a first load): read back
            # to it once; the index the plan returns carries it from then on. Not below a
            # pruned prefix: it was pruned only up to the opener of a window that started
            # there or before, so the opener is after it (and the pinned head's tokens
            # are counted above, from the messages).
            lo = max(p.needs, min(pruned.stop, view.base))
            view = self._views.records(cid, messages, lo, describe)
            p = plan(
                self.policy,
                state,
                view.records,
                base=view.base,
                reserved=reserved,
                pinned_tokens=pinned_tokens,
                fixed=fixed,
            )
        resynced = False
        if p.rewritten:
            logger.warning(
                "demote: history of conversation %r no longer matches its demotion "
                "state (%d messages, window started at %d); re-syncing",
                cid,
                len(messages),
                state.window_start,
            )
            state = ConversationState(generation=state.generation + 1)
            view = self._views.records(cid, messages, 0, describe)
            reserved = given  # the fresh state has no summary
            p = plan(self.policy, state, view.records, base=0, reserved=reserved, fixed=fixed)
            resynced = True
        view.index = p.index
        target = self._advance(state, p, view, messages)
        if (
            self._summarizer is not None
            and isinstance(self.policy.eviction, Compact)
            and p.window_start > max(state.window_start, p.pinned)
        ):
            logger.warning(
                "demote: conversation %r reached limit + 2 x compact_count before a summary "
                "was ready; falling back to bulk eviction (messages go to the hook)",
                cid,
            )
        known = resynced or state.generation > 0
        return Work(
            messages,
            stored,
            p,
            view,
            target,
            resynced,
            known,
            reserved=given,
            pruned=pruned,
            describe=describe,
            fixed=fixed,
        )

    def _advance(
        self, state: ConversationState, p: Plan, view: View, messages: Sequence[Any] = ()
    ) -> ConversationState:
        """The state with the plan's window and clearing watermark applied.

        ``delivered`` is the plan's ``deliver_from`` (the hook's watermark as the plan
        reads it); it moves past it only for Noop, which accepts everything at once.
        ``messages`` (the history planned) gives the note the calls of what a cut drops.
        """
        start = p.window_start
        anchor = view.records[start - 1 - view.base].fingerprint if start > p.pinned else None
        delivered = p.deliver_from
        if self._noop:  # it keeps nothing, so it accepts everything at once
            delivered = max(delivered, p.window_start, p.deliver_to)  # p.deliver.stop
        cleared = max(state.cleared, p.cleared)
        if (start, delivered, p.pinned, anchor, cleared) == (
            state.window_start,
            state.delivered,
            state.pinned,
            state.anchor,
            state.cleared,
        ):
            return state
        trail = (
            state.trail if start == state.window_start else trail_at(state, start, p.pinned, view)
        )
        summary, summarized = state.summary, state.summarized
        lo = max(state.window_start, p.pinned, view.base)
        if self._notes.share and start > lo:
            # A LowWater cut: what it drops leaves a note behind, committed with the
            # window's start, so the prompt stays the same until the next cut. When what
            # the cut keeps leaves the note no room under the limit, it is cut down or
            # left out (it is what can be cut).
            dropped = view.records[lo - view.base : start - view.base]
            summary = self._notes.after_cut(summary, dropped, messages, lo, p.size)
            summarized = start if summary is not None else summarized
        # dataclasses.replace, without its introspection (this runs on most turns)
        return _new_state(
            start,
            delivered,
            p.pinned,
            anchor,
            summary,
            summarized,
            state.offset,
            state.generation,
            trail,
            cleared,
        )

    def unconfirmed(self, cid: str, work: Work) -> None:
        if work.resynced:
            # The view holds a history the committed state does not describe: a later
            # load of it must not pass for a stale copy (whose window hides messages).
            self._views.drop(cid, work.view)

    def window(
        self,
        cid: str,
        work: Work,
        state: ConversationState | None = None,
        demoted: int = 0,
    ) -> Window[Any]:
        """The window ``work`` planned, with the watermark of ``state`` (or the target).

        Pending: what the model is no longer sent in full (it left the window, or it is
        sent as a placeholder) and the hook has not accepted. A placeholder is sent even
        then: the bound wins, the content stays pending and is retried.
        """
        p, s = work.plan, state or work.target
        stop = max(p.window_start, p.deliver_to)  # p.deliver.stop, without a range
        pending = max(0, stop - max(s.delivered, p.pinned))
        events = tuple(work.events) if work.events else ()
        messages = work.messages
        n = len(messages)
        start = min(p.window_start, n)
        if type(messages) is list:  # a list's slices are already fresh lists
            head, kept = messages[: p.pinned], messages[start:]
        else:
            head, kept = list(messages[: p.pinned]), list(messages[start:])
        # Does a kept message open a call? (``calls``: each id's latest opening in the region)
        opened = None if p.index is None else p.index.calls
        calls = opened is None or (bool(opened) and any(map(start.__le__, opened.values())))
        if p.opener is None and not (p.placeholders or p.clipped or p.overhang):
            summary, delivered = s.summary, s.delivered
            return _new_window(
                cid,
                head,
                summary,
                kept,
                start,
                n,
                demoted,
                pending,
                delivered,
                events,
                calls=calls,
            )
        if p.overhang:
            events = (*events, self._overhang_event(cid, work))
        at = p.opener if p.opener is not None and p.opener < n else None
        opener = None if at is None else messages[at]
        opener_rec = (
            None
            if at is None or work.describe is None
            else record_at(work.view, messages, at, work.describe)
        )
        placeholders, clipped = replaced_texts(
            cid, work.view, p, self._chars, _costs_of(self.policy, work), opener_rec
        )
        return _new_window(
            cid,
            head,
            s.summary,
            kept,
            start,
            n,
            demoted,
            pending,
            s.delivered,
            events,
            opener,
            placeholders,
            clipped,
            p.overhang,
            at,
            calls=calls,
        )


def _costs_of(policy: SlidingWindow, work: Work) -> ResultCosts:
    """How ``work``'s plan counted and clipped messages: its index's, else the policy's."""
    index = work.plan.index
    return index.costs if index is not None else result_costs(policy, work.fixed)
