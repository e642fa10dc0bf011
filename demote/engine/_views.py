"""The engine's per-conversation caches: described records, and keys already delivered.

A *view* keeps the records of one conversation's recent messages by message identity, so a
load that appended one message describes one message, and hands the planner its group
index back. It also remembers fingerprints of the newest messages that left it, which is
how a stale, shorter copy of the history (read by a slow request before a newer one
appended) is recognised. Views are bounded: the least recently loaded conversations go
first, and a conversation without one is described again, which costs time, not
correctness.

A view also caches the texts the model is sent instead of cleared or clipped tool results
(:func:`replaced_texts`), by position and fingerprint, so a window with many placeholders
does not hash a dedup key per placeholder on every load; and, by position and identity, the
records of the few messages before it that a load reads all the same (the pinned head a
token window counts, the opener of a window that starts inside a turn:
:func:`record_at`), so a load describes only what was appended.

*Sent* records remember, per conversation, which (position, fingerprint) pairs this
process delivered, so a re-synced history (a rewrite, a fork from an earlier checkpoint)
does not hand a hook without ``has_keys`` the messages it already received.
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from demote.records import (
    TRAIL_DIGITS,
    TRAIL_KEPT,
    ConversationState,
    MessageRecord,
    make_key,
)
from demote.window.clearing import (
    ResultCosts,
    call_marker,
    clipped_text,
    placeholder_text,
    user_clipped_text,
    user_keep,
)
from demote.window.groups import GroupIndex
from demote.window.planner import Plan, needed_from, plan
from demote.window.policy import SlidingWindow

__all__ = [
    "SENT_KEPT",
    "View",
    "ViewCache",
    "after_pruned",
    "record_at",
    "replaced_texts",
    "snapshot_plan",
    "trail_at",
]

T = TypeVar("T")

# How many fingerprints of messages that left the window a conversation's view remembers.
_LEFT_KEPT = 64
_FINGERPRINT = operator.attrgetter("fingerprint")
# How many records of messages before the view (pinned head, openers) it remembers.
_OUTSIDE_KEPT = 32

#: How many delivered positions per conversation a process remembers (newest kept).
SENT_KEPT = 1024


@dataclass(slots=True)
class View:
    """Records of one conversation's recent messages, cached by message identity.

    ``raws[i]`` is the message at absolute index ``base + i`` and ``records[i]`` its
    record; ``left[i]`` is the fingerprint of the message at ``left_base + i``, one of the
    newest that moved out of the view. ``index`` is the planner's group index over (a
    suffix of) those records, set once by the load that made the view; it is only handed
    back to the planner while the messages it covers are the same objects. ``texts``
    maps a position to ``(fingerprint, kind, text)``: a placeholder or clipped text made
    for the record there (shared by the views that follow, checked by fingerprint).
    ``outside`` maps a position before ``base`` to ``(message, record)``: the record of
    a message read there (shared by the views that follow, checked by identity).
    """

    base: int
    raws: list[Any]
    records: list[MessageRecord]
    index: GroupIndex | None = None
    left_base: int = 0
    left: tuple[str, ...] = ()
    texts: dict[int, tuple[str, str, str]] = field(default_factory=dict)
    outside: dict[int, tuple[Any, MessageRecord]] = field(default_factory=dict)


def _short(fp: str) -> int:
    return int(fp[:16], 16)


class ViewCache:
    """Bounded per-conversation views and sent records (least recently loaded go first)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._views: OrderedDict[str, View] = OrderedDict()
        self._sent: OrderedDict[str, dict[int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._views)

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self._views

    def get(self, conversation_id: str) -> View | None:
        """The conversation's view, if cached."""
        return self._views.get(conversation_id)

    def drop(self, conversation_id: str, view: View | None = None) -> None:
        """Forget the view (only if it is still ``view``, when given)."""
        with self._lock:
            if view is None or self._views.get(conversation_id) is view:
                self._views.pop(conversation_id, None)

    def forget(self, conversation_id: str) -> None:
        """Forget the view and the sent record."""
        with self._lock:
            self._views.pop(conversation_id, None)
            self._sent.pop(conversation_id, None)

    def clear(self) -> None:
        """Forget every view (the records; what was sent is kept)."""
        with self._lock:
            self._views.clear()

    # -- sent records --------------------------------------------------------------------

    def mark_sent(self, conversation_id: str, items: Sequence[tuple[int, str]]) -> None:
        """Remember that (position, fingerprint) pairs were delivered in this process."""
        with self._lock:
            sent = self._sent.get(conversation_id)
            if sent is None:
                sent = self._sent[conversation_id] = {}
            self._sent.move_to_end(conversation_id)
            for index, fp in items:
                sent.pop(index, None)
                sent[index] = _short(fp)
            while len(sent) > SENT_KEPT:
                del sent[next(iter(sent))]
            while len(self._sent) > self.size:
                self._sent.popitem(last=False)

    def was_sent(self, conversation_id: str, index: int, fp: str) -> bool:
        """Did this process deliver this message at this position?"""
        sent = self._sent.get(conversation_id)
        return sent is not None and sent.get(index) == _short(fp)

    # -- views ---------------------------------------------------------------------------

    def records(
        self,
        conversation_id: str,
        messages: Sequence[T],
        lo: int,
        describe: Callable[[T], MessageRecord],
    ) -> View:
        """A new view of ``messages[lo:]``, reusing the cached records of the same objects.

        The common case, the cached messages from ``lo`` on are the same objects and
        messages were appended, is checked in one C-level pass and describes only the
        appended messages; it also keeps the cached group index. Anything else (a message
        replaced, the history shorter, ``lo`` before the cache) reuses records one by one
        and drops the index.
        """
        lo = min(lo, len(messages))
        # A list's slice is a fresh list; anything else is copied so the cache owns it.
        raws = messages[lo:] if type(messages) is list else list(messages[lo:])
        view = self._views.get(conversation_id)
        index = None
        if view is None:
            records = [describe(m) for m in raws]
        else:
            vb, vraws, vrecs = view.base, view.raws, view.records
            skip = lo - vb
            kept = len(vraws) - skip  # cached messages from lo on
            if (
                skip >= 0
                and 0 <= kept <= len(raws)
                and all(map(operator.is_, raws, itertools.islice(vraws, skip, None)))
            ):
                records = vrecs[skip:]
                if kept < len(raws):
                    records.extend(map(describe, raws[kept:]))
                index = view.index
            else:
                vn = len(vraws)
                records = []
                for i, m in enumerate(raws, lo):
                    j = i - vb
                    records.append(vrecs[j] if 0 <= j < vn and vraws[j] is m else describe(m))
        left_base, left = (0, ()) if view is None else (view.left_base, view.left)
        if view is not None and 0 < lo - view.base <= len(view.records):
            gone = lo - view.base  # (only the newest of them are kept)
            left = (*left, *map(_FINGERPRINT, view.records[max(0, gone - _LEFT_KEPT) : gone]))
            left = left[-_LEFT_KEPT:]
            left_base = lo - len(left)
        texts: dict[int, tuple[str, str, str]] = {}
        if view is not None and view.texts:
            texts = view.texts
            if len(texts) > len(records):  # positions that left the view
                texts = {i: t for i, t in texts.items() if i >= lo}
        outside: dict[int, tuple[Any, MessageRecord]] = {}
        if view is not None and view.outside and len(view.outside) <= _OUTSIDE_KEPT:
            outside = view.outside
        view = View(lo, raws, records, index, left_base, left, texts, outside)
        with self._lock:
            views = self._views
            views[conversation_id] = view
            views.move_to_end(conversation_id)
            if len(views) > self.size:
                views.popitem(last=False)
        return view

    def is_stale(
        self,
        conversation_id: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
        state: ConversationState,
    ) -> bool:
        """Is ``messages`` an older copy of the history (its last message is one we saw)?

        Only a copy shorter than the window start or than the history the view last saw
        can be one; the common load, as long as both, costs two comparisons. A copy this
        process has not seen is checked against the state's ``trail`` (the messages just
        before the window start, committed by whichever worker moved it).
        """
        n = len(messages)
        view = self._views.get(conversation_id)
        if n >= state.window_start and (view is None or n >= view.base + len(view.records)):
            return False
        if n == 0:
            return True
        i, rec = n - 1, describe(messages[n - 1])
        fp = rec.fingerprint
        if view is not None:
            if view.base <= i < view.base + len(view.records):
                return view.records[i - view.base].fingerprint == fp
            j = i - view.left_base
            if 0 <= j < len(view.left):
                return view.left[j] == fp
        # This process has not seen it: the committed trail tells, as far as it reaches
        # (a trail an earlier release wrote holds the message's legacy fingerprint).
        return n < state.window_start and any(_trail_says(state, i, f) for f in rec.fingerprints)


def record_at(
    view: View, messages: Sequence[T], at: int, describe: Callable[[T], MessageRecord]
) -> MessageRecord:
    """The record of ``messages[at]``: the view's, or described once while it is the same object.

    For the messages before the view that a load reads anyway (the pinned head, an
    opener): a replaced message is described again, as the view's own records are.
    """
    message = messages[at]
    i = at - view.base
    if 0 <= i < len(view.raws) and view.raws[i] is message:
        return view.records[i]
    hit = view.outside.get(at)
    if hit is not None and hit[0] is message:
        return hit[1]
    record = describe(message)
    view.outside[at] = (message, record)
    return record


def trail_at(state: ConversationState, start: int, pinned: int, view: View) -> str:
    """The short fingerprints of the messages before a new window start (see ``trail``).

    Extends the committed trail by the messages that just left the window when it ends
    where they begin (the common cut); otherwise rebuilds it from the records held.
    """
    if start <= pinned:
        return ""
    base, records, d = view.base, view.records, TRAIL_DIGITS
    lo = start - TRAIL_KEPT
    if state.window_start > state.pinned and state.window_start <= start and state.trail:
        first = max(state.window_start, base)
        head = state.trail if first == state.window_start else ""
    else:
        first, head = max(lo, base, pinned), ""
    tail = "".join(records[i - base].fingerprint[:d] for i in range(first, start))
    return (head + tail)[-TRAIL_KEPT * d :]


def _trail_says(state: ConversationState, index: int, fp: str) -> bool:
    """Does the committed trail hold ``fp`` at ``index`` (``False`` if it does not reach)?"""
    d = TRAIL_DIGITS
    first = state.window_start - len(state.trail) // d
    if not first <= index < state.window_start:
        return False
    at = (index - first) * d
    return state.trail[at : at + d] == fp[:d]


def after_pruned(
    messages: Sequence[T], describe: Callable[[T], MessageRecord], pruned: range
) -> tuple[ConversationState | None, int, int | None]:
    """The state to plan a fresh history from when ``pruned`` positions are absent.

    Fresh planning reads from position 0; a history whose front was pruned (after the
    hook accepted it) is planned instead as if everything up to the message right after
    the absent positions (which the prune kept) was delivered. Returns the state, where
    to read from and the pinned head's tokens; ``(None, 0, None)`` (a fresh state, read
    from 0) when nothing is absent.
    """
    if not pruned or pruned.stop >= len(messages):
        return None, 0, None
    lo = pruned.stop
    state = ConversationState(lo + 1, lo + 1, pruned.start, describe(messages[lo]).fingerprint)
    return state, lo, sum(describe(messages[i]).tokens for i in range(pruned.start))


def snapshot_plan(
    policy: SlidingWindow,
    messages: Sequence[T],
    describe: Callable[[T], MessageRecord],
    state: ConversationState,
    reserved: int = 0,
    pruned: range = range(0),
    fixed: int = 0,
) -> tuple[Plan, View, str | None]:
    """The plan, a throwaway view and the summary for a stale copy (nothing is committed).

    A copy shorter than the window start is planned on its own, from a fresh state (what
    its cut leaves out was demoted); a longer one against the committed state, so it gets
    the committed window (or one further on), ending where it ends, with the opener,
    placeholders and clipped results of its own plan. Either way the copy's window obeys
    the policy. Nothing is read from ``pruned`` positions (see :func:`after_pruned`).
    """
    n = len(messages)
    seeded, own_lo, own_pinned = after_pruned(messages, describe, pruned)
    own = seeded or ConversationState()
    basis, pinned_tokens = (state, None) if n >= state.window_start else (own, own_pinned)
    lo = needed_from(basis)
    raws = list(messages[lo:])
    view = View(lo, raws, [describe(m) for m in raws])
    p = plan(
        policy,
        basis,
        view.records,
        base=lo,
        reserved=reserved,
        pinned_tokens=pinned_tokens,
        fixed=fixed,
    )
    if p.needs is not None and not p.rewritten:
        # The window starts inside a turn whose opener is before what was read (or a
        # token window's pinned head is): read back to it, as a load of the history does,
        # never into positions that were pruned.
        at = max(p.needs, pruned.stop) if pruned else p.needs
        raws = list(messages[at:])
        view = View(at, raws, [describe(m) for m in raws])
        p = plan(
            policy,
            basis,
            view.records,
            base=at,
            reserved=reserved,
            pinned_tokens=pinned_tokens,
            fixed=fixed,
        )
    if p.rewritten:  # not the committed history after all: its own window
        raws = list(messages[own_lo:])
        view = View(own_lo, raws, [describe(m) for m in raws])
        p = plan(
            policy,
            own,
            view.records,
            base=own_lo,
            reserved=reserved,
            pinned_tokens=own_pinned,
            fixed=fixed,
        )
    return p, view, state.summary if state.summarized <= n else None


def replaced_texts(
    conversation_id: str,
    view: View,
    p: Plan,
    chars: Callable[[str, int, bool], int],
    costs: ResultCosts,
    opener: MessageRecord | None = None,
) -> tuple[dict[int, str], dict[int, str]]:
    """What the model is sent instead of the plan's cleared and clipped tool results.

    Each text names the message's dedup key (the key the hook archived it under), its
    tool and its token count (:mod:`demote.window.clearing`); a clipped one starts with
    the result's head (``chars(text, tokens, False)``: how many leading characters fit in
    ``tokens``; ``True``: trailing ones); a clipped assistant message's is the marker of
    its cut calls. The ``opener`` shown in front of the window (its record, at
    ``p.opener``), when ``costs`` counts it clipped, is its head and tail around a
    marker. Made once per position and fingerprint (cached in ``view.texts``).

    Returns:
        ``(placeholders, clipped)``: absolute index -> text.
    """
    base, records, cache = view.base, view.records, view.texts
    out: tuple[dict[int, str], dict[int, str]] = ({}, {})
    clipped: Sequence[int] = p.clipped
    if opener is not None and p.opener is not None and costs.opener_clipped(opener):
        clipped = (p.opener, *clipped)
    for kind, indexes in ((0, p.placeholders), (1, clipped)):
        tag = "pc"[kind]
        into = out[kind]
        for i in indexes:
            rec = opener if i == p.opener and opener is not None else records[i - base]
            hit = cache.get(i)
            if hit is not None and hit[0] == rec.fingerprint and hit[1] == tag:
                into[i] = hit[2]
                continue
            key = make_key(conversation_id, i, rec.fingerprint)
            if kind == 0:
                text = placeholder_text(key, rec.tool, rec.tokens)
            elif rec.role == "assistant":  # its calls are cut: what ends each cut value
                text = call_marker(key, rec.tokens)
            elif rec.role == "user":  # the opener in front: its head and tail, what the task is
                head, tail = user_keep(costs.clip_over or 0)
                text = user_clipped_text(
                    rec.text,
                    chars(rec.text, head, False),
                    chars(rec.text, tail, True),
                    key,
                    rec.tokens,
                )
            else:
                text = clipped_text(
                    rec.text, chars(rec.text, costs.head_tokens, False), key, rec.tool, rec.tokens
                )
            cache[i] = (rec.fingerprint, tag, text)
            into[i] = text
    return out
