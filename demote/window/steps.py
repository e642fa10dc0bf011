"""The window's arithmetic over a :class:`~demote.window.groups.GroupIndex` (pure, no I/O).

Given the index of the window region ``[S, end)``, :func:`cut` answers, by bisection over
the index's cumulative sums:

1. *clearing* (with ``policy.clearing``): once the tool results shown in the region pass
   ``trigger`` tokens, the clearing watermark moves over the oldest clearable results, at
   least ``clear_at_least`` tokens' worth and enough to get back under the trigger, never
   over the newest ``keep``. Fewer than ``clear_at_least`` available: nothing is cleared
   yet (clearing less would break the cached prefix for little);
2. *eviction* on what is left: the candidate window starts are the group starts, then the
   step starts of the newest group. The size of a window starting at a candidate is
   ``fixed`` (pinned messages and ``reserved``, token unit only) + the shown cost from the
   candidate on + the turn's opener when the candidate is inside a turn. That size never
   grows from one candidate to the next (the opener costs no more than the group head it
   stands for), so "the oldest start that fits" is a bisection;
3. the placeholders, clipped results, the delivery bound and the overhang of the result.

The room of the note a :class:`~demote.window.policy.LowWater` cut leaves is decided here
too: its share of the limit (:func:`digest_tokens`), which a cut sets aside, and what it
may take once the cut's window is planned (:func:`digest_room`).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from demote.window.clearing import DEFAULT_HEAD_TOKENS, ResultCosts
from demote.window.groups import GroupIndex
from demote.window.policy import (
    Bulk,
    ClearToolResults,
    Compact,
    LowWater,
    PerItem,
    SlidingWindow,
)

__all__ = [
    "FIXED_STEP",
    "Cut",
    "cut",
    "default_clip",
    "digest_room",
    "digest_tokens",
    "result_costs",
]


# (Policy id, fixed step) -> (the policy, its costs): every plan asks, and a policy never
# changes (it is frozen). The policy is held, so its id is not reused while it is here.
_COSTS: dict[tuple[int, int], tuple[SlidingWindow, ResultCosts]] = {}
_COSTS_KEPT = 256

#: The fixed part of a request (what ``fixed`` counts) is rounded up to a multiple of this
#: many tokens before it sizes the default clipping: a system prompt edited by a few words
#: does not change how every clipped result is sent (and the prompt cache with it).
FIXED_STEP = 128


def result_costs(policy: SlidingWindow, fixed: int = 0) -> ResultCosts:
    """How ``policy`` counts each message: clipping (and whether clearing may apply).

    ``fixed``: tokens every request carries that no cut can remove (a system prompt, tool
    definitions); they size the default clipping of a token window (see
    :func:`default_clip`). Ignored where the clipping size is given or not in tokens.
    """
    step = 0
    if policy.unit == "tokens" and fixed > 0:
        clearing = policy.clearing
        if clearing is None or clearing.max_result_tokens is None:
            step = -(-fixed // FIXED_STEP) * FIXED_STEP
    hit = _COSTS.get((id(policy), step))
    if hit is not None and hit[0] is policy:
        return hit[1]
    costs = _result_costs(policy, step)
    if len(_COSTS) >= _COSTS_KEPT:
        _COSTS.clear()
    _COSTS[(id(policy), step)] = (policy, costs)
    return costs


def default_clip(limit: int, fixed: int, head_tokens: int) -> int:
    """The default clipping size of a token window: half the room ``fixed`` leaves.

    A message over it (a tool result, a pasted opener) is sent clipped. Half of what the
    limit leaves beside what every request carries, so the newest step and the opener,
    which no cut removes, fit beside each other under the limit; never under two heads
    (a clipped message must still be worth its head) unless half the limit is. With
    nothing fixed, half the limit.
    """
    return max(min(limit // 2, 2 * head_tokens), (limit - fixed) // 2)


def _result_costs(policy: SlidingWindow, fixed: int) -> ResultCosts:
    clearing = policy.clearing
    if clearing is None:
        clip = (
            default_clip(policy.limit, fixed, DEFAULT_HEAD_TOKENS)
            if policy.unit == "tokens"
            else None
        )
        return ResultCosts(clip, DEFAULT_HEAD_TOKENS)
    clip = clearing.max_result_tokens
    if clip is None and policy.unit == "tokens":
        clip = default_clip(policy.limit, fixed, clearing.head_tokens)
    return ResultCosts(clip, clearing.head_tokens, True, frozenset(clearing.exclude))


@dataclass(slots=True)
class Cut:
    """Where the window starts and what it shows (see the matching :class:`Plan` fields).

    Never changed once made (not frozen: a frozen ``__init__`` costs a call per field,
    on every load).
    """

    window_start: int
    size: int
    compact: tuple[int, int] | None = None
    opener: int | None = None
    cleared: int = 0
    placeholders: tuple[int, ...] = ()
    clipped: tuple[int, ...] = ()
    deliver_to: int = 0
    overhang: int = 0


def _cleared(clearing: ClearToolResults, idx: GroupIndex, start: int, watermark: int) -> int:
    """The clearing watermark after this load's clearing stage."""
    pos = idx.clear_pos
    w0 = max(watermark, start)
    shown = idx.tool_tokens - idx.tools_at[0]
    if w0 > start:
        shown -= idx.saved_before(w0) - idx.saved_before(start)
    if shown <= clearing.trigger:
        return watermark
    p0 = bisect_left(pos, w0)
    top = len(pos) - clearing.keep
    if top <= p0:
        return watermark
    before = idx.clear_before
    have = before[p0]
    available = (before[top] if top < len(pos) else idx.savings) - have
    if available < clearing.clear_at_least:
        return watermark
    need = max(clearing.clear_at_least, shown - clearing.trigger)
    # The fewest oldest results that save ``need`` (all that may go, if they save less).
    p1 = bisect_left(before, have + need, p0 + 1, top)
    return max(watermark, pos[p1 - 1] + 1)


class _Sizes:
    """The size of the window starting at each candidate start, in the policy's unit."""

    __slots__ = ("end", "fixed", "idx", "jl", "n", "unit", "watermark")

    def __init__(self, idx: GroupIndex, unit: str, fixed: int, watermark: int) -> None:
        self.idx, self.unit, self.fixed, self.watermark = idx, unit, fixed, watermark
        self.end = idx.end
        groups = len(idx.starts)
        if unit == "turns":  # a turn cut inside still counts as one: never cut inside
            self.jl = len(idx.cuts)
            self.n = groups
        else:  # whole groups, then the steps of the newest group
            self.jl = bisect_left(idx.cuts, idx.starts[-1])
            self.n = groups - 1 + len(idx.cuts) - self.jl

    def at(self, t: int) -> tuple[int, int, int]:
        """Candidate ``t``: (absolute start, its group, cumulative cost there)."""
        idx = self.idx
        last = len(idx.starts) - 1
        if t < last or self.unit == "turns":
            return idx.starts[t], t, idx.tokens_at[t]
        j = self.jl + t - last
        return idx.cuts[j], last, idx.cuts_at[j]

    def inside(self, pos: int, group: int) -> bool:
        """Does a window starting at ``pos`` need its turn's opener in front?"""
        idx = self.idx
        return pos != idx.starts[group] or (group == 0 and not idx.lead_user)

    def size(self, t: int) -> int:
        idx = self.idx
        pos, group, cum = self.at(t)
        if self.unit == "turns":
            return len(idx.starts) - group
        inside = self.inside(pos, group)
        opener, opener_tokens = idx.opener_at(pos) if inside else (None, 0)
        if self.unit == "messages":
            return self.end - pos + (opener is not None)
        shown = idx.tokens - cum
        if self.watermark > pos:
            shown -= idx.saved_before(self.watermark) - idx.saved_before(pos)
        return self.fixed + shown + opener_tokens

    def fit(self, limit: int) -> int:
        """The oldest candidate whose window is within ``limit`` (else the newest)."""
        lo, hi = 0, self.n - 1
        idx = self.idx
        last = len(idx.starts) - 1
        if self.unit == "tokens" and self.watermark <= idx.start and last > 1:
            # The whole groups after the first need no opener and have nothing cleared
            # before them: their sizes are ``fixed + tokens - tokens_at[t]``, so the
            # bisection over them is one bisect over the cumulative costs.
            t = bisect_left(idx.tokens_at, self.fixed + idx.tokens - limit, 1, last)
            if t < last:
                return 0 if self.size(0) <= limit else t
            lo = last  # none of them fits: the newest group's steps
        while lo < hi:
            mid = (lo + hi) // 2
            if self.size(mid) <= limit:
                hi = mid
            else:
                lo = mid + 1
        return lo


def _compact(idx: GroupIndex, unit: str, k: int) -> tuple[int, int] | None:
    """The oldest whole groups (or, in a lone turn, steps) worth at least ``k`` units."""
    starts = idx.starts
    if len(starts) > 1:
        cum, _ = idx.cumulative(unit)
        covered = min(bisect_left(cum, cum[0] + k), len(starts) - 1)
        return (idx.start, starts[covered]) if covered else None
    if unit == "turns":
        return None
    cuts = idx.cuts
    first = 1 if idx.lead_user else 0  # the opener is never summarized
    if first >= len(cuts) - 1:
        return None
    cum = idx.cuts_at if unit == "tokens" else cuts
    covered = min(bisect_left(cum, cum[first] + k, first + 1), len(cuts) - 1)
    return cuts[first], cuts[covered]


def digest_tokens(policy: SlidingWindow) -> int:
    """Tokens a :class:`LowWater` token window sets aside for the digest of dropped steps."""
    eviction = policy.eviction
    if policy.unit != "tokens" or not isinstance(eviction, LowWater):
        return 0
    return int(policy.limit * eviction.digest_share(policy.limit))


def digest_room(policy: SlidingWindow, size: int, had: int = 0) -> int:
    """Tokens the note a cut leaves may take, its lead and framing included.

    Within the note's share of the limit (:func:`digest_tokens`), and within what the
    limit leaves once the planned window is sent: the plan's ``size`` counted the old
    note, which the new one replaces, so its ``had`` tokens are given back. Never over
    the limit for the note: when what the cut keeps fills it, the room is ``0`` or less,
    and the note is cut down to it or left out
    (:func:`~demote.window.digest.make_digest`).

    Args:
        policy: The window's policy (a :class:`LowWater` token window has a share).
        size: The planned window's size, in the policy's unit (the old note included).
        had: The tokens the old note counted in ``size`` (``0``: there was none).

    Returns:
        ``min(share, limit - size + had)``: may be ``0`` or negative (no room).
    """
    return min(digest_tokens(policy), policy.limit - size + had)


def _low_water(eviction: LowWater, sizes: _Sizes, unit: str, limit: int) -> int:
    """The candidate a :class:`LowWater` cut goes back to (the window is over ``limit``).

    What cannot be cut (pinned messages, ``reserved``, the opener, the newest step) is the
    floor; whole turns are cut back to the floor plus ``keep`` of the room the limit
    leaves above it, and when that lands inside the running turn, its steps are cut back
    to the floor plus ``keep_steps`` of it. A token window also leaves room for the
    digest the cut makes (it replaces the one ``reserved`` counts, at most as large),
    when the window holds tool results to make one of.
    """
    floor = sizes.size(sizes.n - 1)
    room = max(0, limit - floor)
    idx = sizes.idx
    tools = idx.tool_tokens > idx.tools_at[0]  # a digest is only made of tool results
    aside = int(limit * eviction.digest_share(limit)) if unit == "tokens" and tools else 0
    t = sizes.fit(min(limit, floor + int(eviction.keep * room) - aside))
    pos, group, _ = sizes.at(t)
    if group == len(sizes.idx.starts) - 1 and pos != sizes.idx.starts[group]:
        t = max(t, sizes.fit(min(limit, floor + int(eviction.keep_steps * room) - aside)))
    return t


def cut(policy: SlidingWindow, idx: GroupIndex, fixed: int, watermark: int) -> Cut:
    """Clear, then cut the window region ``idx`` describes (see the module docstring).

    Args:
        policy: The window policy.
        idx: The index of the region, under ``result_costs(policy)``.
        fixed: Tokens counted whatever the cut (pinned messages, ``reserved``).
        watermark: The committed clearing watermark.
    """
    start, end = idx.start, idx.end
    unit = policy.unit
    fixed = fixed if unit == "tokens" else 0
    if start >= end:
        over = max(0, fixed - policy.limit)
        return Cut(start, fixed, cleared=watermark, deliver_to=start, overhang=over)
    clearing = policy.clearing
    if clearing is not None:
        watermark = _cleared(clearing, idx, start, watermark)
    sizes = _Sizes(idx, unit, fixed, watermark)
    limit = policy.limit
    eviction = policy.eviction
    total = sizes.size(0)
    t = 0
    compact: tuple[int, int] | None = None
    if isinstance(eviction, PerItem):
        if total > limit:
            t = sizes.fit(limit)
    elif isinstance(eviction, Bulk):
        if total > limit + eviction.overflow:
            t = sizes.fit(limit)
    elif isinstance(eviction, LowWater):
        if total > limit:
            t = _low_water(eviction, sizes, unit, limit)
    elif isinstance(eviction, Compact):
        k = eviction.compact_count
        if total > limit + 2 * k:
            t = sizes.fit(limit)
        elif total > limit + k:
            compact = _compact(idx, unit, k)
    pos, group, _ = sizes.at(t)
    opener = idx.opener_at(pos)[0] if sizes.inside(pos, group) else None
    lo = bisect_left(idx.clear_pos, pos)
    placeholders = idx.clear_pos[lo : bisect_left(idx.clear_pos, watermark, lo)]
    clips = idx.clip_pos[bisect_left(idx.clip_pos, pos) :]
    if placeholders and clips and clips[0] <= placeholders[-1]:
        shown = set(placeholders)
        clips = tuple(i for i in clips if i not in shown)
    deliver_to = max(
        pos, placeholders[-1] + 1 if placeholders else 0, clips[-1] + 1 if clips else 0
    )
    # (sizes never grow from one candidate to the next: a whole window within the limit
    # has no overhang)
    overhang = 0 if total <= limit else max(0, sizes.size(sizes.n - 1) - limit)
    size = total if t == 0 else sizes.size(t)
    return Cut(pos, size, compact, opener, watermark, placeholders, clips, deliver_to, overhang)
