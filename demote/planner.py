"""The pure planner: which messages stay in the active window, which are demoted.

Theory of operation
-------------------
A conversation is a list of messages; positions are absolute and never reused. The
durable :class:`~demote.records.ConversationState` says where the window starts
(``window_start``), how far the hook has acknowledged demotions (``delivered``), and how
many leading system messages are pinned. Each call to :func:`plan` looks only at the
messages from ``needed_from(state)`` to the end: the tail of what was demoted, the current
window and whatever was appended since. Nothing before that is read, so the cost of a call
follows the window, not the history.

Inside that range the planner cuts turn groups: a group starts at a user message, unless a
tool call opened before that message is answered at or after it (then the message belongs
to the running group, so a call and its results are never split, parallel calls included).
The eviction strategy then moves the window start forward over whole groups:

- ``PerItem``: while the window is over the limit, drop its oldest group.
- ``Bulk(overflow)``: only when the window is over ``limit + overflow``, drop oldest groups
  until it is within ``limit``. Between cuts the start stays put (a stable prompt prefix).
- ``Compact(k)``: over ``limit + k``, mark the oldest groups worth at least ``k`` units as
  pending compaction (the engine summarizes them); over ``limit + 2k``, fall back to bulk.

The newest group is never dropped, so a single group larger than the limit stays whole.

Groups are kept in a :class:`~demote._groups.GroupIndex` over the window region: the group
starts and the cumulative sizes at each start, plus the tool calls opened in the region.
A plan returns it (``Plan.index``); handed back to the next plan of the same, grown history,
only the appended records are read and the front groups a new window start dropped are
sliced off, so a steady-state load costs what was appended, not the window. Every cut is a
bisection over the cumulative sizes. Without an index (first load, restart, rewrite) one is
built over the region in one pass; both ways give the same plan.
The window start never moves backwards; a history that no longer matches the state (shorter
than the window start, or a different message just before it) is reported as rewritten
and the caller re-plans from a fresh state.

No I/O, no clocks, no locks: same input, same output.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

from demote._groups import GroupIndex
from demote.policy import Bulk, Compact, PerItem, SlidingWindow
from demote.records import ConversationState, MessageRecord

__all__ = ["Plan", "needed_from", "plan", "turn_groups"]


@dataclass(frozen=True, slots=True)
class Plan:
    """The planner's answer for one load.

    Attributes:
        pinned: Leading system messages kept in front of the window.
        window_start: Where the window should start (absolute index).
        end: Length of the history planned over.
        deliver_from: First message not yet acknowledged by the hook; messages in
            ``[deliver_from, window_start)`` are to be delivered.
        compact: ``(lo, hi)`` range pending compaction, or ``None``.
        size: The window's size in the policy's unit once ``window_start`` applies.
        rewritten: The history no longer matches ``state``; nothing else is meaningful.
        index: The turn groups of the region planned over, ``[max(state.window_start,
            pinned), end)`` (before this plan's cut): pass it to the next :func:`plan`
            of the same, grown history so that only the appended records are read.
            ``None`` when rewritten. Not compared: it describes how, not what.
        opener: When the window starts inside a turn (at a step boundary), the absolute
            index of that turn's opening user message, which stays in front of the kept
            steps (it is before ``window_start``, so it is also delivered); else ``None``.
        cleared: The clearing watermark to commit (``ConversationState.cleared``; never
            below the state's): tool results in ``[window_start, cleared)`` whose tool
            is not excluded are sent as placeholders.
        placeholders: Absolute indexes of the tool results in the window that are sent
            as placeholders (cleared), oldest first.
        clipped: Absolute indexes of the tool results in the window, each alone larger
            than the policy allows, that are sent as their head and a placeholder.
        deliver_to: End of the range to hand to the hook: ``[deliver_from, deliver_to)``.
            At least ``window_start``; beyond it when cleared or clipped results in the
            window must reach the hook before the model is sent their placeholders.
        overhang: Tokens (in the policy's unit) by which what cannot be cut (pinned, the
            opener, the newest step after clipping) alone exceeds the limit; ``0`` when
            it fits.
    """

    pinned: int
    window_start: int
    end: int
    deliver_from: int
    compact: tuple[int, int] | None = None
    size: int = 0
    rewritten: bool = False
    index: GroupIndex | None = field(default=None, compare=False, repr=False)
    opener: int | None = None
    cleared: int = 0
    placeholders: tuple[int, ...] = ()
    clipped: tuple[int, ...] = ()
    deliver_to: int = 0
    overhang: int = 0

    @property
    def deliver(self) -> range:
        """Absolute indexes of the messages to hand to the hook."""
        return range(self.deliver_from, max(self.window_start, self.deliver_to))


def needed_from(state: ConversationState) -> int:
    """First absolute index :func:`plan` reads for ``state`` (before it, nothing)."""
    if state.window_start <= state.pinned:
        return 0
    return min(state.delivered, state.window_start - 1)


def turn_groups(records: Sequence[MessageRecord], lo: int = 0) -> list[int]:
    """Start offsets of the turn groups in ``records[lo:]`` (the first is always ``lo``).

    A user message starts a group unless a tool call opened earlier in the range is
    answered at or after it.
    """
    answered_at: dict[str, int] = {}
    for i in range(lo, len(records)):
        answers = records[i].answers
        if answers is not None:
            answered_at[answers] = i
    starts = [lo]
    reach = -1  # furthest answer of any call opened so far
    for i in range(lo, len(records)):
        rec = records[i]
        if rec.role == "user" and i > lo and reach < i:
            starts.append(i)
        for call_id in rec.opens:
            at = answered_at.get(call_id, -1)
            if at > reach:
                reach = at
    return starts


def plan(
    policy: SlidingWindow,
    state: ConversationState,
    records: Sequence[MessageRecord],
    *,
    base: int = 0,
    index: GroupIndex | None = None,
    reserved: int = 0,
) -> Plan:
    """Plan the window for a history, from the previous state.

    Args:
        policy: The window policy.
        state: The conversation's committed state.
        records: Records of the messages from absolute index ``base`` to the end of the
            history (``base`` must be ``<= needed_from(state)``).
        base: Absolute index of ``records[0]``.
        index: ``Plan.index`` of an earlier plan whose records are, unchanged, a prefix
            of this history: only the records appended since are read. The caller
            vouches for the records; an index that does not fit the state is ignored.
        reserved: Tokens outside the messages that count toward a token limit (the
            system prompt and tool definitions of an agent's model call). Accepted
            here so the engine can pass it; the step planner counts it.

    Returns:
        The plan; ``plan.rewritten`` when the history does not match ``state``.
    """
    end = base + len(records)
    if base > needed_from(state):
        raise ValueError(f"records start at {base}, the plan needs {needed_from(state)}")

    # 1. Pinned system messages: recounted until something has been demoted.
    pinned = state.pinned
    if state.window_start <= state.pinned:
        pinned = 0
        if policy.pin_system:
            while pinned < end and records[pinned - base].role == "system":
                pinned += 1
    # Nothing demoted yet: the window starts right after the pinned messages, wherever
    # they end now (a system message removed from the head moves it back).
    start = pinned if state.window_start <= state.pinned else state.window_start

    # 2. Does the history still match the state?
    if end < state.window_start or (
        state.window_start > state.pinned
        and records[state.window_start - 1 - base].fingerprint != state.anchor
    ):
        return Plan(pinned, start, end, state.delivered, rewritten=True)

    # 3. Turn groups of the window region (only what was appended, given an index).
    groups = None
    if index is not None and base <= index.end <= end:
        groups = index.update(start, records, base=base)
    if groups is None:
        groups = GroupIndex.build(records, start, base=base)

    # 4. The strategy's cut, by bisection over the cumulative sizes.
    cum, top = groups.cumulative(policy.unit)
    last = len(groups.starts) - 1
    total = top - cum[0] if last >= 0 else 0
    limit = policy.limit
    eviction = policy.eviction
    dropped = 0
    compact: tuple[int, int] | None = None
    if isinstance(eviction, PerItem):
        if total > limit:
            dropped = min(bisect_left(cum, top - limit), last)
    elif isinstance(eviction, Bulk):
        if total > limit + eviction.overflow:
            dropped = min(bisect_left(cum, top - limit), last)
    elif isinstance(eviction, Compact):
        k = eviction.compact_count
        if total > limit + 2 * k:
            dropped = min(bisect_left(cum, top - limit), last)
        elif total > limit + k:
            covered = min(bisect_left(cum, cum[0] + k), last)
            if covered:
                compact = (start, groups.starts[covered])
    new_start = start
    if dropped:
        new_start = groups.starts[dropped]
        total = top - cum[dropped]
    fresh = state.window_start <= state.pinned  # nothing demoted yet
    deliver_from = pinned if fresh else max(state.delivered, pinned)
    return Plan(pinned, new_start, end, deliver_from, compact, total, False, groups)
