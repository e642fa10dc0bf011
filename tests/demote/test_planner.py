"""Property tests of the pure planner, replaying append-then-plan like the engine does."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import overload

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from demote.planner import Plan, needed_from, plan, turn_groups
from demote.policy import Bulk, Compact, PerItem, SlidingWindow
from demote.records import ConversationState, MessageRecord
from tests.strategies import Msg, advance, conversations, policies, record_of, sizes

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
    steps: list[Step] = field(default_factory=list)
    handed: list[int] = field(default_factory=list)  # indexes handed to the "hook", in order

    @property
    def state(self) -> ConversationState:
        return self.steps[-1].after if self.steps else ConversationState()


def replay(
    policy: SlidingWindow, msgs: Sequence[Msg], cuts: Sequence[int], fails: Sequence[bool]
) -> Replay:
    """Append the history in chunks ending at ``cuts``; plan after each like the engine.

    A step whose delivery ``fails`` commits nothing (the engine keeps the watermark).
    """
    records = [record_of(m) for m in msgs]
    out = Replay(policy, records)
    for i, end in enumerate(cuts):
        state = out.state
        lo = needed_from(state)
        p = plan(policy, state, records[lo:end], base=lo)
        assert not p.rewritten, "an append-only history is never reported as rewritten"
        ok = not (fails[i % len(fails)] if fails else False) or not p.deliver
        after = advance(state, p, records[:end]) if ok else state
        if ok:
            out.handed.extend(p.deliver)
        out.steps.append(Step(state, p, after, end, ok))
    return out


@st.composite
def replays(draw: st.DrawFn, policy: st.SearchStrategy[SlidingWindow] | None = None) -> Replay:
    pol = draw(policy if policy is not None else policies())
    msgs = draw(conversations())
    n = len(msgs)
    if n == 0:
        cuts = [0]
    elif draw(st.booleans()):
        cuts = list(range(1, n + 1))  # a load after every message
    else:
        cuts = sorted(draw(st.sets(st.integers(1, n), max_size=n)) | {n})
    fails = draw(st.lists(st.booleans(), max_size=4))
    return replay(pol, msgs, cuts, fails)


def check_window_shape(policy: SlidingWindow, view: Sequence[MessageRecord], p: Plan) -> None:
    end = len(view)
    assert p.end == end
    assert 0 <= p.pinned <= p.window_start <= end
    # Pinned system messages: only leading system messages, only when pinning is on.
    assert all(view[i].role == "system" for i in range(p.pinned))
    if not policy.pin_system:
        assert p.pinned == 0
    # The window is a suffix plus the pinned head; never starts inside a turn group.
    if p.pinned < p.window_start < end:
        assert view[p.window_start].role == "user"
    if p.window_start < end and p.window_start > p.pinned:
        assert view[p.window_start].role != "tool"
    opened_at = {call: i for i, r in enumerate(view) for call in r.opens}
    for i in range(p.window_start, end):
        call = view[i].answers
        if call is not None and call in opened_at:
            assert opened_at[call] >= p.window_start, f"tool result {i} lost its call"
    for call, i in opened_at.items():
        if i < p.window_start:
            answers = [j for j in range(end) if view[j].answers == call]
            assert all(j < p.window_start for j in answers), f"call {call} split"
    size, _ = sizes(policy, view[p.window_start :])
    assert p.size == size


@SETTINGS
@given(replays())
def test_window_is_pinned_head_plus_whole_group_suffix(r: Replay) -> None:
    for step in r.steps:
        check_window_shape(r.policy, r.records[: step.end], step.plan)


@SETTINGS
@given(replays())
def test_window_start_is_monotonic_and_watermark_trails_it(r: Replay) -> None:
    prev = ConversationState()
    for step in r.steps:
        assert step.plan.window_start >= step.before.window_start
        assert step.after.window_start >= prev.window_start
        assert step.after.delivered <= step.after.window_start
        assert step.plan.deliver_from == max(step.before.delivered, step.plan.pinned)
        prev = step.after


@SETTINGS
@given(replays())
def test_every_demoted_message_is_handed_over_once(r: Replay) -> None:
    state = r.state
    assert len(r.handed) == len(set(r.handed))
    assert sorted(r.handed) == list(range(state.pinned, state.window_start))
    assert r.handed == sorted(r.handed), "oldest first"


@SETTINGS
@given(replays())
def test_limit_respected_unless_one_oversized_group(r: Replay) -> None:
    ev = r.policy.eviction
    slack = {PerItem: 0}.get(type(ev))
    if isinstance(ev, Bulk):
        slack = ev.overflow
    elif isinstance(ev, Compact):
        slack = 2 * ev.compact_count
    assert slack is not None
    for step in r.steps:
        size, groups = sizes(r.policy, r.records[step.plan.window_start : step.end])
        assert size <= r.policy.limit + slack or groups == 1


@SETTINGS
@given(replays(policies().filter(lambda p: isinstance(p.eviction, PerItem))))
def test_per_item_drops_only_what_it_must(r: Replay) -> None:
    for step in r.steps:
        p = step.plan
        size, groups = sizes(r.policy, r.records[p.window_start : step.end])
        assert size <= r.policy.limit or groups == 1
        start = max(step.before.window_start, p.pinned)
        if p.window_start > start:
            # Keeping the group just before the new start would have been over the limit.
            before = turn_groups(r.records[start : p.window_start])[-1] + start
            assert sizes(r.policy, r.records[before : step.end])[0] > r.policy.limit


@SETTINGS
@given(replays(policies().filter(lambda p: isinstance(p.eviction, PerItem))))
def test_per_item_incremental_equals_from_scratch(r: Replay) -> None:
    for step in r.steps:
        fresh = plan(r.policy, ConversationState(), r.records[: step.end])
        assert fresh.window_start == step.plan.window_start
        assert fresh.pinned == step.plan.pinned
        assert fresh.size == step.plan.size


@SETTINGS
@given(replays(policies().filter(lambda p: isinstance(p.eviction, Bulk))))
def test_bulk_prefix_is_stable_between_cuts(r: Replay) -> None:
    ev = r.policy.eviction
    assert isinstance(ev, Bulk)
    for step in r.steps:
        p = step.plan
        start = max(step.before.window_start, p.pinned)
        before_size, _ = sizes(r.policy, r.records[start : step.end])
        size, groups = sizes(r.policy, r.records[p.window_start : step.end])
        if p.window_start == start:
            # No cut: the prompt prefix (pinned head + first kept message) is unchanged.
            assert before_size <= r.policy.limit + ev.overflow or groups == 1
        else:
            assert before_size > r.policy.limit + ev.overflow
            assert size <= r.policy.limit or groups == 1


@SETTINGS
@given(replays(policies().filter(lambda p: isinstance(p.eviction, Compact))))
def test_compact_pending_range_covers_whole_older_groups(r: Replay) -> None:
    ev = r.policy.eviction
    assert isinstance(ev, Compact)
    k = ev.compact_count
    for step in r.steps:
        p = step.plan
        window = r.records[p.window_start : step.end]
        size, groups = sizes(r.policy, window)
        assert size <= r.policy.limit + 2 * k or groups == 1
        if p.compact is None:
            continue
        lo, hi = p.compact
        assert lo == p.window_start, "a pending compaction starts at the window start"
        starts = [s + p.window_start for s in turn_groups(window)]
        assert hi in starts[1:], "covers whole groups, never the newest"
        assert r.policy.limit + k < size <= r.policy.limit + 2 * k
        covered, _ = sizes(r.policy, r.records[lo:hi])
        if r.policy.unit == "turns":
            covered = len(turn_groups(r.records[lo:hi]))
        # The fewest whole groups worth at least k units (or all but the newest).
        prev = starts[starts.index(hi) - 1]
        less, _ = sizes(r.policy, r.records[lo:prev])
        if r.policy.unit == "turns":
            less = len(turn_groups(r.records[lo:prev])) if prev > lo else 0
        assert covered >= k or hi == starts[-1]
        assert less < k


@settings(max_examples=100, deadline=None)
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
    for step in r.steps:
        lo = needed_from(step.before)
        log: set[int] = set()
        if whole:  # hand it everything: it must still not look before lo
            p = plan(r.policy, step.before, Spy(r.records[: step.end], 0, log))
        else:
            p = plan(r.policy, step.before, Spy(r.records[lo : step.end], lo, log), base=lo)
        assert p == step.plan
        assert not log or min(log) >= lo


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


def test_single_oversized_group_is_kept_whole() -> None:
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
    assert p.window_start == 2 and p.size == 6


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
