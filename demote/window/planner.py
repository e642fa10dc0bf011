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

Inside that range the planner cuts turn groups and steps (:mod:`demote.window.groups`): a
result answers the latest opening of its call id before it (a reused id is a new call; a
result whose call is not in the range, demoted before it arrived, joins nothing); a group
starts at a user message, unless the message lies after a call's opening and at or before
one of its answers; a step starts at an assistant message under the same rule, so a call
and all of its results (parallel calls included) are one step, and a call left unanswered
at the end of the history by an interrupt stays with its step. A window starts at a group
start, or, when the newest (running) group alone is over the limit, at a step start inside
it: then the newest user message before it, the *opener* (the turn's opening message, or
an interjection the user made while a call ran), is shown in front of the kept steps
(``Plan.opener``; it is before ``window_start``, so it is delivered too), counted as it is
sent: over ``max_result_tokens``, its head and tail around a marker
(:meth:`~demote.window.clearing.ResultCosts.opener`). It depends on the
records before the window start alone, not on what was demoted when, so a cached index
and a fresh plan name the same one. Every window is therefore pinned system messages, the
summary, maybe the opener, then whole steps: no result without its call, no call without
its results, a user message first. A turn with no user message before it at all (a history
that starts with an assistant or tool message) has no opener; its steps are cut the same
way and the window starts with the assistant message of its first kept step
(``Plan.opener`` is ``None``).

Each message counts what the model is sent (:class:`~demote.window.clearing.ResultCosts`): a
tool result over ``max_result_tokens`` (default: half a token limit) counts as its head
and a placeholder, an assistant message over it with long call arguments as it is sent
with them cut (``MessageRecord.clipped_tokens``; both in ``Plan.clipped``). In a token
window the pinned system messages and ``reserved`` (a system prompt and tools sent
outside the messages) count toward the limit; the messages unit counts messages (the
opener is one), the turns unit counts turns (a turn cut inside still counts as one, so a
turns window never cuts inside a turn).

Stage 1, clearing (``policy.clearing``): once the tool results shown in the window pass
``trigger`` tokens, the clearing watermark (``Plan.cleared``, never below the state's)
moves over the oldest clearable results, never the newest ``keep`` nor an excluded tool,
at least ``clear_at_least`` tokens at a time. Results before the watermark are shown as
placeholders (``Plan.placeholders``); their content must reach the hook first, so
``Plan.deliver_to`` covers every placeholder and clipped result (delivery is a prefix, so
``delivered`` may run ahead of ``window_start``).

Stage 2, eviction, only on what clearing left: the candidate starts are the group starts,
then the step starts of the newest group; the window size never grows from one candidate
to the next, so every cut is a bisection over the index's cumulative sums:

- ``PerItem``: while the window is over the limit, drop its oldest group (or step).
- ``Bulk(overflow)``: only when the window is over ``limit + overflow``, cut back to
  ``limit``. Between cuts the start stays put (a stable prompt prefix).
- ``LowWater(keep, keep_steps, digest)`` (the token default): only when the window is
  over ``limit``, cut back to the floor (what cannot be cut) plus ``keep`` of the room
  above it, or ``keep_steps`` of it when that lands inside the running turn, less the
  digest's room in a token window. Between cuts the start stays put; the engine commits
  the digest of what a cut drops (:mod:`demote.window.digest`) with the new start.
- ``Compact(k)``: over ``limit + k``, mark the oldest whole groups worth at least ``k``
  units (in a lone running turn, its oldest steps after the opener) as pending compaction
  (``Plan.compact``; the engine summarizes them); over ``limit + 2k``, fall back to bulk.

What cannot be cut (pinned, the opener and the newest step, both after clipping) may alone exceed
the limit: ``Plan.overhang`` says by how much, so the caller can act. Anything else is
within the limit (+ overflow, + 2k).

The index over the window region (a :class:`~demote.window.groups.GroupIndex`: group starts,
step starts, cumulative sizes and clearing sums, the tool calls opened in the region, the
opener of a region that starts inside a turn) is returned as ``Plan.index``; handed back to
the next plan of the same, grown history, only the appended records are read and the front
a new window start dropped is sliced off, so a steady-state load costs what was appended,
not the window or the turn. Without an index (first load, restart, rewrite) one is built
over the region in one pass; both ways give the same plan. One exception: after a restart,
the opener of a turn the window starts inside lies before ``needed_from(state)`` (the state
does not store it); such a plan sets ``Plan.needs`` and the caller plans again with records
from that index.
The window start never moves backwards; a history that no longer matches the state (shorter
than the window start, or a different message just before it) is reported as rewritten
and the caller re-plans from a fresh state.

No I/O, no clocks, no locks: same input, same output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from demote._built import unchecked
from demote._validate import count
from demote.records import ConversationState, MessageRecord
from demote.window.groups import GroupIndex
from demote.window.policy import SlidingWindow
from demote.window.steps import cut, result_costs

__all__ = ["Plan", "answer_reach", "needed_from", "plan", "turn_groups"]


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
            index of the newest user message before it, which stays in front of the kept
            steps (it is before ``window_start``, so it is also delivered); else ``None``.
        cleared: The clearing watermark to commit (``ConversationState.cleared``; never
            below the state's): tool results in ``[window_start, cleared)`` whose tool
            is not excluded are sent as placeholders.
        placeholders: Absolute indexes of the tool results in the window that are sent
            as placeholders (cleared), oldest first.
        clipped: Absolute indexes of the tool results in the window, each alone larger
            than the policy allows, that are sent as their head and a placeholder, and
            of the assistant messages sent with their long call arguments cut.
        deliver_to: End of the range to hand to the hook: ``[deliver_from, deliver_to)``.
            At least ``window_start``; beyond it when cleared or clipped results in the
            window must reach the hook before the model is sent their placeholders.
        overhang: Tokens (in the policy's unit) by which what cannot be cut (pinned, the
            opener, the newest step after clipping) alone exceeds the limit; ``0`` when
            it fits.
        needs: ``None``, unless the window starts inside a turn whose opener the records
            given do not reach (a restart: no index, records from ``needed_from``), or a
            token window's pinned head is out of their reach and its tokens were not
            given (``pinned_tokens``): then plan again with records from this index
            (``0``: where the opener is, is not stored). Until then the plan has no
            ``opener`` and may undercount the pinned head.
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
    needs: int | None = None

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

    A result answers the latest opening of its call id before it in the range; a user
    message starts a group unless it lies after a call's opening and at or before one of
    its answers.
    """
    reach_of = answer_reach(records, lo)
    starts = [lo]
    reach = -1  # furthest answer of any call opened so far
    for i in range(lo, len(records)):
        if records[i].role == "user" and i > lo and reach < i:
            starts.append(i)
        reach = max(reach, reach_of.get(i, -1))
    return starts


def answer_reach(records: Sequence[MessageRecord], lo: int = 0) -> dict[int, int]:
    """Index of an opening in ``records[lo:]`` -> the furthest answer bound to it.

    A result answers the latest opening of its call id before it (providers require unique
    ids, so a reused id is a new call); a result whose call is not opened in the range
    answers nothing there.
    """
    latest: dict[str, int] = {}
    reach: dict[int, int] = {}
    for i in range(lo, len(records)):
        rec = records[i]
        if rec.answers is not None:
            opened = latest.get(rec.answers)
            if opened is not None:
                reach[opened] = i
        for call_id in rec.opens:
            latest[call_id] = i
    return reach


_new_plan = unchecked(Plan)  # every load makes one, of values checked here


def plan(
    policy: SlidingWindow,
    state: ConversationState,
    records: Sequence[MessageRecord],
    *,
    base: int = 0,
    index: GroupIndex | None = None,
    reserved: int = 0,
    pinned_tokens: int | None = None,
    fixed: int | None = None,
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
        reserved: Tokens sent with every request outside the messages (a system prompt
            and tool definitions a middleware adds): they count toward a token limit.
        fixed: The part of ``reserved`` every request carries unchanged (a system prompt,
            tool definitions; not a note or memory that grows): it sizes the default
            clipping (:func:`~demote.window.steps.default_clip`). ``None``: all of
            ``reserved``.
        pinned_tokens: Tokens of the pinned system messages, for a token window whose
            records start after them (``base > 0``) and whose index is not given (a
            restart). Otherwise counted from the records or carried by the index; when
            unknown, they count ``0``.

    Returns:
        The plan; ``plan.rewritten`` when the history does not match ``state``.
    """
    end = base + len(records)
    if base > needed_from(state):
        raise ValueError(f"records start at {base}, the plan needs {needed_from(state)}")
    if reserved:
        count("reserved", reserved, minimum=0)
    if fixed is None:
        fixed = reserved

    # 1. Pinned system messages: recounted until something has been demoted.
    pinned = state.pinned
    fresh = state.window_start <= state.pinned  # nothing demoted yet
    if fresh:
        pinned = 0
        if policy.pin_system:
            while pinned < end and records[pinned - base].role == "system":
                pinned += 1
    # Nothing demoted yet: the window starts right after the pinned messages, wherever
    # they end now (a system message removed from the head moves it back).
    start = pinned if fresh else state.window_start

    # 2. Does the history still match the state?
    if end < state.window_start or (
        not fresh and not records[state.window_start - 1 - base].known_as(state.anchor)
    ):
        return Plan(pinned, start, end, state.delivered, rewritten=True)

    # 3. Groups and steps of the window region (only what was appended, given an index).
    costs = result_costs(policy, fixed)
    groups = None
    if (
        index is not None
        and (index.costs is costs or index.costs == costs)
        and base <= index.end <= end
    ):
        groups = index.update(start, records, base=base)
        if groups is not None and index.start < pinned:
            # Built before these pinned messages were counted: its pinned tokens are not theirs.
            groups = replace(groups, pinned_tokens=None)
        if groups is not None and not fresh and _lacks_opener(groups):
            groups = None  # built from records that did not reach it: look again
    needs: int | None = None
    if groups is None:
        opener: int | None = None
        opener_tokens = 0
        openerless = False
        if not fresh and start < end and records[start - base].role != "user":
            # The window starts inside a turn: its opener lies before the region.
            opener = _opener(records, base, start)
            if opener is not None:
                opener_tokens = costs.opener(records[opener - base])
            elif base > 0:
                needs = 0
            else:
                openerless = True  # the history has no user message before it
        groups = GroupIndex.build(
            records,
            start,
            base=base,
            costs=costs,
            opener=opener,
            opener_tokens=opener_tokens,
            openerless=openerless,
        )
    if pinned_tokens is None:
        if base == 0:
            pinned_tokens = sum(records[i].tokens for i in range(pinned)) if pinned else 0
        else:
            pinned_tokens = groups.pinned_tokens
            if pinned_tokens is None and index is not None and index.start >= pinned:
                # An index that did not fit (built again above) still knew the pinned
                # head's tokens: the pinned messages do not change once something is demoted.
                pinned_tokens = index.pinned_tokens
    if pinned_tokens is not None and groups.pinned_tokens != pinned_tokens:
        groups = replace(groups, pinned_tokens=pinned_tokens)
    if pinned_tokens is None and pinned and policy.unit == "tokens" and needs is None:
        needs = 0  # the pinned head counts toward the limit, and it is out of reach

    # 4. Clearing, then the strategy's cut, by bisection over the cumulative sizes.
    fixed = (pinned_tokens or 0) + reserved
    c = cut(policy, groups, fixed, state.cleared)
    if (
        needs is not None
        and pinned_tokens is not None
        and (
            c.opener is not None
            or (c.window_start < end and records[c.window_start - base].role == "user")
        )
    ):
        needs = None  # the cut left the turn whose opener was out of reach
    # Nothing demoted: what was delivered is the pinned head (recounted), unless clearing
    # had results in the window delivered ahead of it.
    ahead = state.delivered > state.window_start
    deliver_from = pinned if fresh and not ahead else max(state.delivered, pinned)
    return _new_plan(
        pinned,
        c.window_start,
        end,
        deliver_from,
        c.compact,
        c.size,
        False,
        groups,
        c.opener,
        c.cleared,
        c.placeholders,
        c.clipped,
        c.deliver_to,
        c.overhang,
        needs,
    )


def _lacks_opener(groups: GroupIndex) -> bool:
    return (
        groups.start < groups.end
        and not groups.lead_user
        and groups.opener is None
        and not groups.openerless
    )


def _opener(records: Sequence[MessageRecord], base: int, start: int) -> int | None:
    """The newest user message before ``start``, if ``records`` reach one."""
    for i in range(start - 1 - base, -1, -1):
        if records[i].role == "user":
            return base + i
    return None
