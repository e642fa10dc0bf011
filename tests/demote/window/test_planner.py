"""Property tests of the pure planner, replaying append-then-plan like the engine does.

Histories are chat conversations (``conversations``) and agent runs (``agent_histories``:
long requests of tool steps, parallel and failed calls, an interrupted final call); policies
are every unit and strategy, with and without clearing. At every load the plan must equal
the plain two-pass reference (``reference_plan``), its window must obey the providers'
ordering rules, and it must stay within the bound but for what cannot be cut.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import overload

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from demote.records import ConversationState, MessageRecord
from demote.window.groups import GroupIndex
from demote.window.planner import Plan, needed_from, plan, turn_groups
from demote.window.policy import Bulk, Compact, SlidingWindow
from tests.strategies import (
    Msg,
    advance,
    agent_histories,
    agent_policies,
    check_valid,
    conversations,
    cut_points,
    examples,
    policies,
    record_of,
    reference_plan,
    slack,
)

SETTINGS = settings(
    max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@dataclass
class Step:
    before: ConversationState
    plan: Plan
    after: ConversationState
    end: int
    delivered: bool


@dataclass
class Replay:
    policy: SlidingWindow
    records: list[MessageRecord]
    reserved: int = 0
    steps: list[Step] = field(default_factory=list)
    handed: list[int] = field(default_factory=list)  # indexes handed to the "hook", in order

    @property
    def state(self) -> ConversationState:
        return self.steps[-1].after if self.steps else ConversationState()


def replay(
    policy: SlidingWindow,
    msgs: Sequence[Msg],
    cuts: Sequence[int],
    fails: Sequence[bool],
    reserved: int = 0,
) -> Replay:
    """Append the history in chunks ending at ``cuts``; plan after each like the engine.

    Each plan gets the previous plan's index, as the engine's view hands it back. A step
    whose delivery ``fails`` commits nothing (the engine keeps the watermark).
    """
    records = [record_of(m) for m in msgs]
    out = Replay(policy, records, reserved)
    index: GroupIndex | None = None
    for i, end in enumerate(cuts):
        state = out.state
        lo = needed_from(state)
        p = plan(policy, state, records[lo:end], base=lo, index=index, reserved=reserved)
        assert not p.rewritten, "an append-only history is never reported as rewritten"
        index = p.index
        ok = not (fails[i % len(fails)] if fails else False) or not p.deliver
        after = advance(state, p, records[:end]) if ok else state
        if ok:
            out.handed.extend(i for i in p.deliver if i not in out.handed)
        out.steps.append(Step(state, p, after, end, ok))
    return out


histories = st.one_of(conversations(), agent_histories(), agent_histories(max_steps=30))
any_policy = st.one_of(policies(), agent_policies())


@st.composite
def replays(draw: st.DrawFn, policy: st.SearchStrategy[SlidingWindow] | None = None) -> Replay:
    pol = draw(policy if policy is not None else any_policy)
    msgs = draw(histories)
    n = len(msgs)
    if n == 0:
        cuts = [0]
    elif draw(st.booleans()):
        cuts = list(range(1, n + 1))  # a load after every message
    else:
        cuts = sorted(draw(st.sets(st.integers(1, n), max_size=n)) | {n})
    fails = draw(st.lists(st.booleans(), max_size=4))
    reserved = draw(st.sampled_from([0, 0, 30, 400])) if pol.unit == "tokens" else 0
    return replay(pol, msgs, cuts, fails, reserved)


@SETTINGS
@given(replays())
def test_every_plan_is_the_reference_plan(r: Replay) -> None:
    for step in r.steps:
        ref = reference_plan(r.policy, step.before, r.records[: step.end], r.reserved)
        assert ref is not None and ref.matches(step.plan), (ref, step.plan)


@SETTINGS
@given(replays())
def test_every_window_obeys_the_ordering_rules(r: Replay) -> None:
    for step in r.steps:
        p = step.plan
        assert 0 <= p.pinned <= p.window_start <= p.end == step.end
        assert all(r.records[i].role == "system" for i in range(p.pinned))
        if not r.policy.pin_system:
            assert p.pinned == 0
        check_valid(r.records, p)


@SETTINGS
@given(replays())
def test_window_start_and_clearing_watermark_are_monotonic(r: Replay) -> None:
    prev = ConversationState()
    for step in r.steps:
        p = step.plan
        assert p.window_start >= step.before.window_start
        assert p.cleared >= step.before.cleared
        assert step.after.window_start >= prev.window_start
        assert step.after.cleared >= prev.cleared
        before = step.before
        fresh = before.window_start <= before.pinned and before.delivered <= before.window_start
        assert p.deliver_from == (p.pinned if fresh else max(before.delivered, p.pinned))
        prev = step.after


@SETTINGS
@given(replays())
def test_every_demoted_message_is_handed_over_once(r: Replay) -> None:
    state = r.state
    assert len(r.handed) == len(set(r.handed))
    assert r.handed == sorted(r.handed), "oldest first"
    assert r.handed == list(range(state.pinned, max(state.delivered, state.pinned)))
    assert state.delivered >= state.window_start


@SETTINGS
@given(replays())
def test_bound_holds_but_for_the_reported_overhang(r: Replay) -> None:
    for step in r.steps:
        p = step.plan
        assert p.overhang >= 0
        if p.size > r.policy.limit + slack(r.policy):
            # Only what cannot be cut: pinned, the opener and the newest step.
            assert p.size == r.policy.limit + p.overhang
            window = r.records[p.window_start : step.end]
            inner = cut_points(r.records[: step.end], p.window_start)
            if r.policy.unit == "turns":
                assert len(turn_groups(window)) == 1
            else:
                assert inner in ([], [p.window_start]), "more than one step left"


@SETTINGS
@given(replays())
def test_placeholders_and_clips_reach_the_hook_first(r: Replay) -> None:
    for step in r.steps:
        p = step.plan
        assert p.deliver_to >= p.window_start
        for i in (*p.placeholders, *p.clipped):
            assert p.window_start <= i < p.end and r.records[i].role == "tool"
            assert (i < p.deliver_to and i in p.deliver) or i < step.before.delivered
        assert not set(p.placeholders) & set(p.clipped)
        assert all(i < p.cleared for i in p.placeholders)
        if r.policy.clearing is None:
            assert p.placeholders == () and p.cleared == step.before.cleared
        if step.delivered:
            assert step.after.delivered >= p.deliver_to


@SETTINGS
@given(replays(any_policy.filter(lambda p: isinstance(p.eviction, Bulk))))
def test_bulk_prefix_is_stable_between_cuts(r: Replay) -> None:
    ev = r.policy.eviction
    assert isinstance(ev, Bulk)
    for step in r.steps:
        p = step.plan
        start = max(step.before.window_start, p.pinned)
        if p.window_start == start:
            # No cut: the prompt prefix (pinned head, opener, first kept message) stays.
            assert p.size <= r.policy.limit + ev.overflow or p.overhang > 0
        else:
            assert p.size <= r.policy.limit or p.size == r.policy.limit + p.overhang


@SETTINGS
@given(replays(any_policy.filter(lambda p: isinstance(p.eviction, Compact))))
def test_compact_pending_range_covers_whole_groups_or_steps(r: Replay) -> None:
    ev = r.policy.eviction
    assert isinstance(ev, Compact)
    k = ev.compact_count
    for step in r.steps:
        p = step.plan
        assert p.size <= r.policy.limit + 2 * k or p.size == r.policy.limit + p.overhang
        if p.compact is None:
            continue
        lo, hi = p.compact
        assert r.policy.limit + k < p.size <= r.policy.limit + 2 * k
        window = r.records[: step.end]
        starts = turn_groups(window, p.window_start)
        if len(starts) > 1:
            assert lo == p.window_start, "whole groups from the window start"
            assert hi in starts[1:], "covers whole groups, never the newest"
        else:
            cuts = cut_points(window, p.window_start)
            assert hi in cuts[1:] and lo in cuts and lo < hi, "whole steps, never the newest"
            assert r.records[lo].role != "user", "the opener is never summarized"
            if r.records[p.window_start].role == "user":
                assert lo == cuts[1]
            else:
                assert lo == p.window_start


@settings(max_examples=examples(100), deadline=None)
@given(conversations(interject=True, system=False), st.data())
def test_turn_groups_keep_calls_with_results(msgs: list[Msg], data: st.DataObject) -> None:
    """Parallel calls, results in any order, a user interjecting: groups stay whole."""
    records = [record_of(m) for m in msgs]
    lo = data.draw(st.integers(0, len(records)))
    starts = turn_groups(records, lo)
    assert starts[0] == lo and starts == sorted(set(starts))
    opened_at = {c: i for i, r in enumerate(records) for c in r.opens}
    bounds = [*starts, len(records)]
    group_of = {}
    for g, (s, e) in enumerate(pairwise(bounds)):
        for i in range(s, e):
            group_of[i] = g
    for i in range(lo, len(records)):
        call = records[i].answers
        if call is not None and opened_at.get(call, -1) >= lo:
            assert group_of[i] == group_of[opened_at[call]]
        if i in starts[1:]:
            assert records[i].role == "user"


# -- cost: the planner reads only what needed_from(state) says ----------------------------


class Spy(Sequence[MessageRecord]):
    """A Sequence that logs every absolute index read through it (slices too)."""

    def __init__(self, items: list[MessageRecord], offset: int, log: set[int]) -> None:
        self.items, self.offset, self.log = items, offset, log

    def __len__(self) -> int:
        return len(self.items)

    @overload
    def __getitem__(self, i: int) -> MessageRecord: ...
    @overload
    def __getitem__(self, i: slice) -> Spy: ...
    def __getitem__(self, i: int | slice) -> MessageRecord | Spy:
        if isinstance(i, slice):
            lo, hi, stride = i.indices(len(self.items))
            assert stride == 1
            return Spy(self.items[lo:hi], self.offset + lo, self.log)
        if i < 0:
            i += len(self.items)
        item = self.items[i]
        self.log.add(self.offset + i)
        return item

    def __iter__(self) -> Iterator[MessageRecord]:
        for i in range(len(self.items)):
            yield self[i]


@SETTINGS
@given(replays(), st.booleans())
def test_planner_reads_nothing_before_needed_from(r: Replay, whole: bool) -> None:
    """Without an index: the records from ``needed_from`` on, and two small exceptions.

    Handed the whole history, it also reads the pinned messages (to count them in a token
    window) and, when the window starts inside a turn, back to that turn's opener. Handed
    only what ``needed_from`` says, a plan whose opener is out of reach says so
    (``needs``) rather than read further.
    """
    for step in r.steps:
        lo = needed_from(step.before)
        log: set[int] = set()
        pinned = step.plan.pinned
        if whole:  # hand it everything
            p = plan(r.policy, step.before, Spy(r.records[: step.end], 0, log), reserved=r.reserved)
            assert p == step.plan
            ws = step.before.window_start
            inside = ws > step.before.pinned and ws < step.end and r.records[ws].role != "user"
            outside = {i for i in log if i < lo}
            assert outside <= set(range(pinned)) or inside, "read back only for an opener"
        else:
            p = plan(
                r.policy,
                step.before,
                Spy(r.records[lo : step.end], lo, log),
                base=lo,
                reserved=r.reserved,
                pinned_tokens=sum(x.tokens for x in r.records[:pinned]),
            )
            assert not log or min(log) >= lo
            if p != step.plan:  # only when the opener is out of reach
                ws = step.before.window_start
                assert p.needs == 0 and r.records[ws].role != "user"
                # The engine then plans again from what ``needs`` names: the same plan.
                again = plan(
                    r.policy,
                    step.before,
                    Spy(r.records[p.needs : step.end], p.needs, set()),
                    base=p.needs,
                    reserved=r.reserved,
                    pinned_tokens=sum(x.tokens for x in r.records[:pinned]),
                )
                assert again == step.plan, repr((again, step.plan, step.before))


def test_cost_does_not_grow_with_history() -> None:
    """A long history behind the window is never touched."""
    policy = SlidingWindow.last_messages(4)
    msgs = [record_of(Msg("user" if i % 2 == 0 else "assistant", f"m{i}")) for i in range(10_000)]
    state = ConversationState()
    for end in range(2, len(msgs) + 1, 2):
        lo = needed_from(state)
        log: set[int] = set()
        p = plan(policy, state, Spy(msgs[lo:end], lo, log), base=lo)
        assert len(log) <= 8
        state = advance(state, p, msgs[:end])
    assert state.window_start == len(msgs) - 4


def test_records_starting_after_needed_from_are_refused() -> None:
    policy = SlidingWindow.last_messages(2)
    msgs = [record_of(Msg("user", str(i))) for i in range(6)]
    state = advance(ConversationState(), plan(policy, ConversationState(), msgs), msgs)
    assert needed_from(state) == 3
    with pytest.raises(ValueError, match="needs 3"):
        plan(policy, state, msgs[4:], base=4)


# -- rewrite detection ---------------------------------------------------------------------


@SETTINGS
@given(replays(), st.data())
def test_rewrites_are_detected(r: Replay, data: st.DataObject) -> None:
    state = r.state
    assume(state.window_start > state.pinned)
    lo = needed_from(state)
    records = r.records
    # Shorter than the window start.
    cut = data.draw(st.integers(0, state.window_start - 1))
    assert plan(r.policy, state, records[:cut]).rewritten
    # A different message just before the window start.
    changed = list(records)
    i = state.window_start - 1
    old = changed[i]
    changed[i] = MessageRecord(old.role, old.text + "!", old.fingerprint + "x", old.tokens)
    assert plan(r.policy, state, changed[lo:], base=lo).rewritten
    # Appending is not a rewrite; nor is the same history again.
    assert not plan(r.policy, state, records[lo:], base=lo).rewritten


def test_rewrite_examples() -> None:
    policy = SlidingWindow.last_messages(2)
    msgs = [record_of(Msg("user", f"m{i}")) for i in range(5)]
    p = plan(policy, ConversationState(), msgs)
    state = advance(ConversationState(), p, msgs)
    assert state.window_start == 3
    assert plan(policy, state, msgs[:2]).rewritten
    other = [*msgs[:2], record_of(Msg("user", "edited")), *msgs[3:]]
    assert plan(policy, state, other[2:], base=2).rewritten
    assert not plan(policy, state, msgs[2:], base=2).rewritten


# -- named examples ------------------------------------------------------------------------


def test_a_long_turn_is_cut_at_the_newest_step_that_fits() -> None:
    """Was: the newest group was kept whole (6 messages over a limit of 2)."""
    policy = SlidingWindow.last_messages(2)
    ids = ("a", "b", "c")
    msgs = [
        Msg("user", "q1"),
        Msg("assistant", "r1"),
        Msg("user", "q2"),
        Msg("assistant", "", opens=ids),
        *[Msg("tool", f"t{c}", answers=c) for c in reversed(ids)],
        Msg("assistant", "done"),
    ]
    records = [record_of(m) for m in msgs]
    p = plan(policy, ConversationState(), records)
    # The opener q2, then the last step: two messages; the call and its results left whole.
    assert (p.window_start, p.opener, p.size, p.overhang) == (7, 2, 2, 0)
    # Without the final answer, the newest step is the call and its three results: it
    # cannot be cut, and the plan says by how much it is over.
    p = plan(policy, ConversationState(), records[:7])
    assert (p.window_start, p.opener, p.size, p.overhang) == (3, 2, 5, 3)
    assert p.deliver == range(0, 3)  # the opener is archived too (it is before the start)


def test_system_messages_are_pinned_and_not_counted() -> None:
    policy = SlidingWindow.last_messages(1)
    msgs = [
        record_of(Msg(r, t))
        for r, t in [("system", "s"), ("system", "t"), ("user", "a"), ("user", "b")]
    ]
    p = plan(policy, ConversationState(), msgs)
    assert (p.pinned, p.window_start, p.size) == (2, 3, 1)
    p = plan(policy.model_copy(update={"pin_system": False}), ConversationState(), msgs)
    assert (p.pinned, p.window_start) == (0, 3)
