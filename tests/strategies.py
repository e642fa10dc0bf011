"""Hypothesis strategies shared by the core's tests (attrs keeps its strategies here too).

A conversation is a list of :class:`Msg`: optional system messages at the head, then turn
groups of one user message followed by assistant replies and tool exchanges (one or
several parallel calls, answered in any order). :func:`record_of` turns a ``Msg`` into the
planner's :class:`~demote.records.MessageRecord`; :func:`describer` does the same through a
:class:`~demote.engine.Demoter` so token counts go through its cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st

from demote.planner import Plan, turn_groups
from demote.policy import Bulk, Compact, PerItem, SlidingWindow
from demote.records import ConversationState, MessageRecord, fingerprint
from demote.tokens import MESSAGE_OVERHEAD, approximate_tokens


@dataclass(frozen=True, slots=True, eq=False)
class Msg:
    """A framework-free stand-in for a chat message (compared by identity, like real ones)."""

    role: str
    text: str
    opens: tuple[str, ...] = ()
    answers: str | None = None

    def same(self, other: Msg) -> bool:
        return (self.role, self.text, self.opens, self.answers) == (
            other.role,
            other.text,
            other.opens,
            other.answers,
        )


def record_of(msg: Msg) -> MessageRecord:
    """The planner's record of ``msg`` under the default approximate counter."""
    fp = fingerprint(msg.role, msg.text, msg.opens, msg.answers)
    tokens = approximate_tokens(msg.text) + MESSAGE_OVERHEAD
    return MessageRecord(msg.role, msg.text, fp, tokens, msg.opens, msg.answers)  # type: ignore[arg-type]


def describer(demoter: Any) -> Callable[[Msg], MessageRecord]:
    """A ``describe`` callable for :meth:`Demoter.load` over :class:`Msg` objects."""

    def describe(msg: Msg) -> MessageRecord:
        return demoter.describe(msg.role, msg.text, opens=msg.opens, answers=msg.answers)

    return describe


_serial = itertools.count()


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


def evictions(unit: str) -> st.SearchStrategy[PerItem | Bulk | Compact]:
    """Every eviction strategy, with sizes that make sense for ``unit``."""
    top = 40 if unit == "tokens" else 6
    return st.one_of(
        st.just(PerItem()),
        st.builds(Bulk, overflow=st.integers(0, top)),
        st.builds(Compact, compact_count=st.integers(1, top)),
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

    ``records`` are the whole history from index 0.
    """
    anchor = records[p.window_start - 1].fingerprint if p.window_start > p.pinned else None
    fresh = state.window_start <= state.pinned  # nothing demoted before
    return replace(
        state,
        window_start=p.window_start,
        delivered=p.window_start if fresh else max(state.delivered, p.window_start),
        pinned=p.pinned,
        anchor=anchor,
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
