"""Hypothesis strategies shared by the core's tests (attrs keeps its strategies here too).

A conversation is a list of :class:`Msg`: optional system messages at the head, then turn
groups of one user message followed by assistant replies and tool exchanges (one or
several parallel calls, answered in any order). :func:`record_of` turns a ``Msg`` into the
planner's :class:`~demote.records.MessageRecord`; :func:`describer` does the same through a
:class:`~demote.engine.Demoter` so token counts go through its cache.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from demote.records import ConversationState, MessageRecord, fingerprint
from demote.window.clearing import clipped_text, placeholder_text
from demote.window.planner import Plan, turn_groups
from demote.window.policy import (
    Bulk,
    ClearToolResults,
    Compact,
    LowWater,
    PerItem,
    SlidingWindow,
)
from demote.window.tokens import MESSAGE_OVERHEAD, approximate_tokens


@dataclass(frozen=True, slots=True, eq=False)
class Msg:
    """A framework-free stand-in for a chat message (compared by identity, like real ones)."""

    role: str
    text: str
    opens: tuple[str, ...] = ()
    answers: str | None = None
    tool: str | None = None

    def same(self, other: Msg) -> bool:
        return (self.role, self.text, self.opens, self.answers, self.tool) == (
            other.role,
            other.text,
            other.opens,
            other.answers,
            other.tool,
        )


def record_of(msg: Msg) -> MessageRecord:
    """The planner's record of ``msg`` under the default approximate counter."""
    fp = fingerprint(msg.role, msg.text, msg.opens, msg.answers)
    tokens = approximate_tokens(msg.text) + MESSAGE_OVERHEAD
    return MessageRecord(msg.role, msg.text, fp, tokens, msg.opens, msg.answers, msg.tool)  # type: ignore[arg-type]


def describer(demoter: Any) -> Callable[[Msg], MessageRecord]:
    """A ``describe`` callable for :meth:`Demoter.load` over :class:`Msg` objects."""

    def describe(msg: Msg) -> MessageRecord:
        return demoter.describe(msg.role, msg.text, opens=msg.opens, answers=msg.answers)

    return describe


_serial = itertools.count()


def examples(n: int, *, cost: int = 1) -> int:
    """A property test's example budget: ``n``, or under ``make fuzz`` the fuzz budget.

    ``make fuzz`` selects the ``fuzz`` Hypothesis profile (``DEMOTE_HYPOTHESIS_PROFILE``,
    see tests/conftest.py), whose ``max_examples`` is the budget per test; a test whose
    example costs about ``cost`` planner examples (an agent run) gets that share of it,
    and never fewer than ``n``.
    """
    if os.environ.get("DEMOTE_HYPOTHESIS_PROFILE") != "fuzz":
        return n
    return max(n, settings.default.max_examples // cost)


def unique(msgs: Sequence[Msg], tag: str = "") -> list[Msg]:
    """Copies of ``msgs`` whose texts are unique in this process (so keys never collide)."""
    return [replace(m, text=f"{tag}#{next(_serial)} {m.text}") for m in msgs]


texts = st.text(alphabet="abcdefgh ijklm", max_size=40)


@st.composite
def turn(
    draw: st.DrawFn, calls: itertools.count[int] | None = None, *, interject: bool = False
) -> list[Msg]:
    """One turn group: a user message, then replies and tool exchanges.

    With ``interject``, a user message may arrive between a tool call and its results
    (it then belongs to the running group).
    """
    calls = calls if calls is not None else itertools.count()
    out = [Msg("user", draw(texts))]
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            out.append(Msg("assistant", draw(texts)))
            continue
        ids = tuple(f"call_{next(calls)}" for _ in range(draw(st.integers(1, 3))))
        out.append(Msg("assistant", draw(texts), opens=ids))
        if interject and draw(st.integers(0, 3)) == 0:
            out.append(Msg("user", "interjection " + draw(texts)))
        for call_id in draw(st.permutations(ids)):
            out.append(Msg("tool", draw(texts), answers=call_id))
    if draw(st.booleans()):
        out.append(Msg("assistant", draw(texts)))
    return out


@st.composite
def conversations(
    draw: st.DrawFn,
    *,
    min_turns: int = 0,
    max_turns: int = 12,
    system: bool = True,
    interject: bool = False,
) -> list[Msg]:
    """A whole conversation: system messages at the head, maybe a greeting, then turns."""
    calls = itertools.count()
    out: list[Msg] = []
    if system:
        out += [Msg("system", "sys " + draw(texts)) for _ in range(draw(st.integers(0, 2)))]
    if draw(st.integers(0, 4)) == 0:
        out.append(Msg("assistant", "hello " + draw(texts)))
    for _ in range(draw(st.integers(min_turns, max_turns))):
        out += draw(turn(calls, interject=interject))
    return out


def low_waters() -> st.SearchStrategy[LowWater]:
    """LowWater evictions, from the defaults to the extremes of each share."""
    shares = st.sampled_from([0.0, 0.1, 0.2, 0.5, 0.8])
    return st.one_of(
        st.just(LowWater()),
        st.builds(LowWater, keep=shares, keep_steps=shares, digest=st.just(0.0)),
        st.builds(LowWater, keep=shares, keep_steps=shares, digest=st.sampled_from([0.05, 0.1])),
    )


def evictions(unit: str) -> st.SearchStrategy[PerItem | Bulk | Compact | LowWater]:
    """Every eviction strategy, with sizes that make sense for ``unit``."""
    top = 40 if unit == "tokens" else 6
    return st.one_of(
        st.just(PerItem()),
        st.builds(Bulk, overflow=st.integers(0, top)),
        st.builds(Compact, compact_count=st.integers(1, top)),
        low_waters(),
    )


_LIMITS = {"messages": (1, 12), "turns": (1, 5), "tokens": (4, 120)}
_SMALL_LIMITS = {"messages": (1, 4), "turns": (1, 2), "tokens": (4, 30)}


@st.composite
def policies(
    draw: st.DrawFn,
    units: Sequence[str] = ("messages", "turns", "tokens"),
    counters: Sequence[str] = ("approx",),
    *,
    small: bool = False,
) -> SlidingWindow:
    """A policy of any unit and eviction strategy (the approx counter by default).

    ``small`` limits make short conversations demote often (for the state machines).
    """
    unit = draw(st.sampled_from(list(units)))
    lo, hi = (_SMALL_LIMITS if small else _LIMITS)[unit]
    return SlidingWindow(
        unit=unit,
        limit=draw(st.integers(lo, hi)),
        eviction=draw(evictions(unit)),
        pin_system=draw(st.booleans()),
        counter=draw(st.sampled_from(list(counters))),
    )


def advance(
    state: ConversationState, p: Plan, records: Sequence[MessageRecord]
) -> ConversationState:
    """The state the engine commits after a successful delivery of ``p`` (its ``_advance``).

    The hook took ``p.deliver``, cleared and clipped results included, so the watermark
    moves to its end and the clearing watermark is committed.

    ``records`` are the whole history from index 0.
    """
    anchor = records[p.window_start - 1].fingerprint if p.window_start > p.pinned else None
    fresh = state.window_start <= state.pinned  # nothing demoted before
    to = max(p.window_start, p.deliver_to)
    return replace(
        state,
        window_start=p.window_start,
        delivered=to if fresh else max(state.delivered, to),
        pinned=p.pinned,
        anchor=anchor,
        cleared=max(state.cleared, p.cleared),
    )


def sizes(policy: SlidingWindow, recs: Sequence[MessageRecord]) -> tuple[int, int]:
    """(size in the policy's unit, number of turn groups) of a window, counted afresh."""
    if not recs:
        return 0, 0
    groups = len(turn_groups(recs))
    if policy.unit == "turns":
        return groups, groups
    if policy.unit == "messages":
        return len(recs), groups
    return sum(r.tokens for r in recs), groups


def slack(policy: SlidingWindow) -> int:
    """How far over its limit the policy lets a window grow (Bulk, Compact)."""
    ev = policy.eviction
    if isinstance(ev, Bulk):
        return ev.overflow
    if isinstance(ev, Compact):
        return 2 * ev.compact_count
    return 0


def within_bound(policy: SlidingWindow, recs: Sequence[MessageRecord]) -> bool:
    """Does a window obey the policy's bound (or hold one group too big to cut)?"""
    size, groups = sizes(policy, recs)
    return size <= policy.limit + slack(policy) or groups <= 1


# -- agents: long turns of tool steps, clearing policies, and a two-pass oracle --------------

TOOLS = ("search", "read_file", "shell", "memory")

#: Tool result lengths (characters): small, medium, and over a clipping threshold.
_RESULT_CHARS = st.sampled_from([0, 20, 90, 250, 700, 1300]).flatmap(
    lambda n: st.integers(n, n + 60)
)


@st.composite
def agent_turn(draw: st.DrawFn, calls: itertools.count[int], *, max_steps: int = 8) -> list[Msg]:
    """One request to an agent: the user's task, then steps (calls and their results).

    A step is an assistant message and the results of its calls (none to three, parallel
    calls answered in any order; some tools fail). The turn may end with a plain answer.
    """
    out = [Msg("user", "task " + draw(texts))]
    for _ in range(draw(st.integers(0, max_steps))):
        k = draw(st.integers(0, 3))
        if k == 0:
            out.append(Msg("assistant", "note " + draw(texts)))
            continue
        ids = tuple(f"call_{next(calls)}" for _ in range(k))
        names = [draw(st.sampled_from(TOOLS)) for _ in ids]
        out.append(Msg("assistant", draw(texts), opens=ids))
        for j in draw(st.permutations(range(k))):
            failed = draw(st.integers(0, 5)) == 0
            body = ("error: tool failed " if failed else "") + "r" * draw(_RESULT_CHARS)
            out.append(Msg("tool", f"{ids[j]} {body}", answers=ids[j], tool=names[j]))
    if draw(st.booleans()):
        out.append(Msg("assistant", "done " + draw(texts)))
    return out


@st.composite
def agent_histories(
    draw: st.DrawFn, *, max_turns: int = 4, max_steps: int = 10, system: bool = True
) -> list[Msg]:
    """Agent conversations: system messages, requests of many steps, maybe an interrupt.

    An interrupted history ends with a step whose calls are not all answered.
    """
    calls = itertools.count()
    out: list[Msg] = []
    if system:
        out += [Msg("system", "sys " + draw(texts)) for _ in range(draw(st.integers(0, 2)))]
    for _ in range(draw(st.integers(1, max_turns))):
        out += draw(agent_turn(calls, max_steps=max_steps))
    if draw(st.integers(0, 3)) == 0:  # interrupted: a call left unanswered at the end
        ids = tuple(f"call_{next(calls)}" for _ in range(draw(st.integers(1, 3))))
        out.append(Msg("assistant", "calling", opens=ids))
        for call_id in ids[: draw(st.integers(0, len(ids) - 1))]:
            out.append(Msg("tool", f"{call_id} partial", answers=call_id, tool="shell"))
    return out


@st.composite
def clearings(draw: st.DrawFn) -> ClearToolResults:
    """Any clearing stage, with sizes that make small agent histories clear and clip."""
    return ClearToolResults(
        trigger=draw(st.integers(0, 400)),
        keep=draw(st.integers(0, 3)),
        exclude=tuple(sorted(draw(st.sets(st.sampled_from(TOOLS), max_size=2)))),
        clear_at_least=draw(st.integers(0, 200)),
        max_result_tokens=draw(st.none() | st.integers(1, 300)),
        head_tokens=draw(st.integers(0, 60)),
    )


_AGENT_LIMITS = {"messages": (2, 16), "turns": (1, 3), "tokens": (40, 1200)}


@st.composite
def agent_policies(
    draw: st.DrawFn, units: Sequence[str] = ("messages", "turns", "tokens")
) -> SlidingWindow:
    """A policy for agent histories: any unit and strategy, with or without clearing."""
    unit = draw(st.sampled_from(list(units)))
    lo, hi = _AGENT_LIMITS[unit]
    top = 400 if unit == "tokens" else 6
    eviction = draw(
        st.one_of(
            st.just(PerItem()),
            st.builds(Bulk, overflow=st.integers(0, top)),
            st.builds(Compact, compact_count=st.integers(1, top)),
        )
    )
    return SlidingWindow(
        unit=unit,
        limit=draw(st.integers(lo, hi)),
        eviction=eviction,
        pin_system=draw(st.booleans()),
        clearing=draw(st.none() | clearings()),
    )


def cut_points(records: Sequence[MessageRecord], lo: int) -> list[int]:
    """Where a group or a step may start in ``records[lo:]`` (absolute), in two passes.

    A result answers the latest opening of its call id before it; no user or assistant
    message after that opening, up to the result, starts anything.
    """
    span: list[tuple[int, int]] = []  # (opening, answer) of every result bound in range
    for i in range(lo, len(records)):
        call = records[i].answers
        opened = [j for j in range(lo, i) if call is not None and call in records[j].opens]
        if opened:
            span.append((opened[-1], i))
    return [
        i
        for i in range(lo, len(records))
        if i == lo
        or (records[i].role in ("user", "assistant") and not any(o < i <= a for o, a in span))
    ]


@dataclass(frozen=True, slots=True)
class Reference:
    """What :func:`reference_plan` decides (the fields a :class:`Plan` must match)."""

    pinned: int
    window_start: int
    compact: tuple[int, int] | None
    size: int
    opener: int | None
    cleared: int
    placeholders: tuple[int, ...]
    clipped: tuple[int, ...]
    deliver_to: int
    overhang: int

    def matches(self, p: Plan) -> bool:
        return self == Reference(
            p.pinned,
            p.window_start,
            p.compact,
            p.size,
            p.opener,
            p.cleared,
            p.placeholders,
            p.clipped,
            p.deliver_to,
            p.overhang,
        )


def _shown_cost(policy: SlidingWindow, rec: MessageRecord, fixed: int = 0) -> tuple[int, bool, int]:
    """(cost, clipped, what clearing it would save) of one record, from the policy.

    ``fixed``: what every request carries beside the window (here the reserved share); the
    default clipping is half the room it leaves, counted in whole steps of 128 tokens, and
    never under two heads unless half the limit is.
    """
    c = policy.clearing
    head = c.head_tokens if c is not None else 200
    clip = c.max_result_tokens if c is not None else None
    if clip is None and policy.unit == "tokens":
        step = math.ceil(fixed / 128) * 128
        clip = max(min(policy.limit // 2, 2 * head), (policy.limit - step) // 2)
    # A placeholder message and a clipped result's tail, as langchain-core counts the
    # message sent: its text, the id it answers, the role and the tool's name.
    framing = len(rec.answers or "") + len("tool") + len(rec.tool or "")
    key = "0" * 32  # every archived key has 32 characters
    placeholder = math.ceil((len(placeholder_text(key, rec.tool, rec.tokens)) + framing) / 4) + 3
    tail = math.ceil((len(clipped_text("", 0, key, rec.tool, rec.tokens)) + framing) / 4) + 3
    cost, clipped = rec.tokens, False
    if rec.role == "tool" and clip is not None and rec.tokens > max(clip, head + tail):
        cost, clipped = head + tail, True
    cut = rec.clipped_tokens
    assistant = rec.role == "assistant" and clip is not None and rec.tokens > clip
    if assistant and cut is not None and cut < rec.tokens:  # its long call arguments are cut
        cost, clipped = cut, True
    clearable = (
        c is not None
        and rec.role == "tool"
        and cost > placeholder
        and not (rec.tool is not None and rec.tool in c.exclude)
    )
    return cost, clipped, cost - placeholder if clearable else 0


def _note_share(ev: LowWater, limit: int) -> float:
    """The note's share of the limit: as given, or 15% raised to 1,000 tokens up to 25%."""
    if ev.digest is not None:
        return ev.digest
    return max(0.15, min(1000 / limit, 0.25, 0.95 - max(ev.keep, ev.keep_steps)))


def reference_plan(
    policy: SlidingWindow,
    state: ConversationState,
    records: Sequence[MessageRecord],
    reserved: int = 0,
) -> Reference | None:
    """The planner's rules, written as plainly as possible over the whole history.

    ``None`` when the history does not match ``state`` (a rewrite).
    """
    end = len(records)
    fresh = state.window_start <= state.pinned
    pinned = state.pinned
    if fresh:
        pinned = 0
        while policy.pin_system and pinned < end and records[pinned].role == "system":
            pinned += 1
    start = pinned if fresh else state.window_start
    if end < state.window_start or (
        not fresh and records[state.window_start - 1].fingerprint != state.anchor
    ):
        return None
    if start >= end:
        fixed = sum(r.tokens for r in records[:pinned]) + reserved
        size = fixed if policy.unit == "tokens" else 0
        over = max(0, size - policy.limit)
        return Reference(pinned, start, None, size, None, state.cleared, (), (), start, over)
    costs = [_shown_cost(policy, r, reserved) for r in records]
    groups = [g for g in cut_points(records, start) if g == start or records[g].role == "user"]
    cuts = cut_points(records, start)

    # Clearing: oldest clearable results first, never the newest ``keep``.
    clearable = [i for i in range(start, end) if costs[i][2]]
    watermark = state.cleared
    c = policy.clearing
    if c is not None:
        w0 = max(watermark, start)
        shown = sum(
            costs[i][0] - costs[i][2] if i < w0 else costs[i][0]
            for i in range(start, end)
            if records[i].role == "tool"
        )
        allowed = [i for i in clearable[: max(0, len(clearable) - c.keep)] if i >= w0]
        available = sum(costs[i][2] for i in allowed)
        if shown > c.trigger and allowed and available >= c.clear_at_least:
            need = max(c.clear_at_least, shown - c.trigger)
            saved = 0
            for i in allowed:
                saved += costs[i][2]
                watermark = max(watermark, i + 1)
                if saved >= need:
                    break

    def group_of(pos: int) -> int:
        return max(g for g in groups if g <= pos)

    def opener_at(pos: int) -> int | None:
        """The newest user message before a start that is not one (none before: none)."""
        if records[pos].role == "user":
            return None
        return max((i for i in range(pos) if records[i].role == "user"), default=None)

    def size(pos: int) -> int:
        opener = opener_at(pos)
        if policy.unit == "turns":
            return len(turn_groups(records, pos))
        if policy.unit == "messages":
            return end - pos + (opener is not None)
        shown = sum(costs[i][0] - (costs[i][2] if i < watermark else 0) for i in range(pos, end))
        fixed = sum(r.tokens for r in records[:pinned]) + reserved
        return fixed + shown + (costs[opener][0] if opener is not None else 0)

    if policy.unit == "turns":
        candidates = groups
    else:
        candidates = groups[:-1] + [p for p in cuts if p >= groups[-1]]
    limit = policy.limit

    def fit() -> int:
        for pos in candidates:
            if size(pos) <= limit:
                return pos
        return candidates[-1]

    ev = policy.eviction
    total = size(start)
    ws, compact = start, None
    over = limit + (ev.overflow if isinstance(ev, Bulk) else 0)
    if isinstance(ev, PerItem | Bulk) and total > over:
        ws = fit()
    elif isinstance(ev, LowWater) and total > limit:
        # Back to the floor (what cannot be cut) plus a share of the room above it, less
        # the digest's room in a token window; inside the running turn, keep_steps' share.
        floor = size(candidates[-1])
        room = max(0, limit - floor)
        tools = sum(costs[i][0] for i in range(start, end) if records[i].role == "tool") > 0
        aside = int(limit * _note_share(ev, limit)) if policy.unit == "tokens" and tools else 0

        def oldest_within(bound: int) -> int:
            return next((c for c in candidates if size(c) <= bound), candidates[-1])

        ws = oldest_within(min(limit, floor + int(ev.keep * room) - aside))
        if ws not in groups:
            ws = max(ws, oldest_within(min(limit, floor + int(ev.keep_steps * room) - aside)))
    elif isinstance(ev, Compact):
        k = ev.compact_count
        if total > limit + 2 * k:
            ws = fit()
        elif total > limit + k:
            compact = _reference_compact(policy, records, groups, cuts, costs, k)
    placeholders = tuple(i for i in clearable if ws <= i < watermark)
    clipped = tuple(i for i in range(ws, end) if costs[i][1] and i not in placeholders)
    deliver_to = max([ws, *(i + 1 for i in placeholders), *(i + 1 for i in clipped)])
    overhang = max(0, size(candidates[-1]) - limit)
    return Reference(
        pinned,
        ws,
        compact,
        size(ws),
        opener_at(ws),
        watermark,
        placeholders,
        clipped,
        deliver_to,
        overhang,
    )


def _reference_compact(
    policy: SlidingWindow,
    records: Sequence[MessageRecord],
    groups: list[int],
    cuts: list[int],
    costs: list[tuple[int, bool, int]],
    k: int,
) -> tuple[int, int] | None:
    def worth(lo: int, hi: int) -> int:
        if policy.unit == "turns":
            return len([g for g in groups if lo <= g < hi])
        if policy.unit == "messages":
            return hi - lo
        return sum(costs[i][0] for i in range(lo, hi))

    if len(groups) > 1:
        for g in groups[1:]:
            if worth(groups[0], g) >= k or g == groups[-1]:
                return groups[0], g
    if policy.unit == "turns":
        return None
    first = 1 if records[cuts[0]].role == "user" else 0
    if first >= len(cuts) - 1:
        return None
    for c in cuts[first + 1 :]:
        if worth(cuts[first], c) >= k or c == cuts[-1]:
            return cuts[first], c
    return None  # pragma: no cover - the loop always returns


def window_of(p: Plan) -> list[int]:
    """Absolute indexes of the messages a plan shows: pinned, the opener, the kept ones."""
    opener = [p.opener] if p.opener is not None else []
    return [*range(p.pinned), *opener, *range(p.window_start, p.end)]


def check_valid(records: Sequence[MessageRecord], p: Plan) -> None:
    """Assert the providers' ordering rules on a plan's window.

    No tool result without its call; no call without all of its results (but a call left
    unanswered at the end of the history stays with its step); the first message after
    the system messages is a user message whenever the history has one before the
    window's first kept message.
    """
    shown = window_of(p)
    where = set(shown)
    opened = {c: i for i in shown for c in records[i].opens}
    for i in shown:
        call = records[i].answers
        if call is not None:
            assert call in opened, f"tool result {i} shown without its call"
    answers: dict[str, list[int]] = {}
    for i, rec in enumerate(records[: p.end]):
        if rec.answers is not None:
            answers.setdefault(rec.answers, []).append(i)
    for call in opened:
        assert all(j in where for j in answers.get(call, [])), f"call {call} lost a result"
    if p.opener is not None:
        assert records[p.opener].role == "user" and p.opener < p.window_start
    rest = [i for i in shown if records[i].role != "system"]
    had_user = any(r.role == "user" for r in records[p.pinned : p.window_start + 1])
    if rest and had_user and p.window_start < p.end:
        assert records[rest[0]].role == "user", "the window does not start with a user message"
