"""The planner's incremental group index: planning with ``index=`` equals planning afresh.

Replays append-then-plan like the engine (deliveries that fail, compactions that commit
late, resets) and, at every step, plans three ways over the same state and records: with
the previous plan's index, without one, and with the two-pass reference planner the index
replaced (kept here as the oracle). All three must agree on every field, and the index must
describe exactly the groups and sizes a fresh pass finds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from demote._groups import GroupIndex
from demote.planner import Plan, needed_from, plan, turn_groups
from demote.policy import Bulk, Compact, PerItem, SlidingWindow
from demote.records import ConversationState, MessageRecord
from tests.strategies import Msg, advance, conversations, policies, record_of

# Random policies include Compact without a summarizer, on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::demote.errors.DemoteWarning")

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the oracle: the planner as it was before the index (two passes over the region) ------


def _reference_sizes(
    records: Sequence[MessageRecord], starts: list[int], policy: SlidingWindow
) -> list[int]:
    ends = [*starts[1:], len(records)]
    if policy.unit == "turns":
        return [1] * len(starts)
    if policy.unit == "messages":
        return [e - s for s, e in zip(starts, ends, strict=True)]
    return [sum(r.tokens for r in records[s:e]) for s, e in zip(starts, ends, strict=True)]


def _reference_evict(limit: int, sizes: list[int], total: int) -> tuple[int, int]:
    dropped = 0
    while total > limit and dropped < len(sizes) - 1:
        total -= sizes[dropped]
        dropped += 1
    return dropped, total


def reference_plan(
    policy: SlidingWindow, state: ConversationState, records: Sequence[MessageRecord]
) -> Plan:
    """The planner before the incremental index, over the whole history (base 0)."""
    end = len(records)
    pinned = state.pinned
    if state.window_start <= state.pinned:
        pinned = 0
        if policy.pin_system:
            while pinned < end and records[pinned].role == "system":
                pinned += 1
    start = max(state.window_start, pinned)
    if end < state.window_start or (
        state.window_start > state.pinned
        and records[state.window_start - 1].fingerprint != state.anchor
    ):
        return Plan(pinned, start, end, state.delivered, rewritten=True)
    local = records[start:]
    starts = turn_groups(local)
    sizes = _reference_sizes(local, starts, policy) if local else []
    total = sum(sizes)
    eviction = policy.eviction
    dropped = 0
    compact: tuple[int, int] | None = None
    if isinstance(eviction, PerItem):
        dropped, total = _reference_evict(policy.limit, sizes, total)
    elif isinstance(eviction, Bulk):
        if total > policy.limit + eviction.overflow:
            dropped, total = _reference_evict(policy.limit, sizes, total)
    elif isinstance(eviction, Compact):
        k = eviction.compact_count
        if total > policy.limit + 2 * k:
            dropped, total = _reference_evict(policy.limit, sizes, total)
        elif total > policy.limit + k:
            covered, groups = 0, 0
            while covered < k and groups < len(sizes) - 1:
                covered += sizes[groups]
                groups += 1
            if groups:
                compact = (start, start + starts[groups])
    new_start = start + starts[dropped] if dropped else start
    return Plan(pinned, new_start, end, max(state.delivered, pinned), compact, total)


# -- histories: well-formed conversations, and anything at all ------------------------------

CALL_IDS = ("a", "b", "c")


@st.composite
def chaotic(draw: st.DrawFn) -> list[Msg]:
    """Any sequence: late, duplicate, unknown and early answers, reused and repeated ids."""
    out = []
    for _ in range(draw(st.integers(0, 40))):
        role = draw(st.sampled_from(["system", "user", "user", "assistant", "tool"]))
        opens: tuple[str, ...] = ()
        answers = None
        if role in ("assistant", "user") and draw(st.integers(0, 3)) == 0:
            opens = tuple(draw(st.lists(st.sampled_from(CALL_IDS), min_size=1, max_size=3)))
        if role in ("tool", "user") and draw(st.integers(0, 2)) == 0:
            answers = draw(st.sampled_from(CALL_IDS))
        text = draw(st.text(alphabet="abcdefgh ", max_size=30))
        out.append(Msg(role, text, opens, answers))
    return out


@st.composite
def late_answers(draw: st.DrawFn) -> list[Msg]:
    """Calls answered several turns later, while new user turns keep arriving."""
    out = [Msg("system", "sys")] if draw(st.booleans()) else []
    pending: list[str] = []
    for n in range(draw(st.integers(0, 25))):
        step = draw(st.sampled_from(["turn", "call", "answer", "reply"]))
        if step == "call":
            ids = tuple(f"c{n}_{j}" for j in range(draw(st.integers(1, 3))))
            out.append(Msg("assistant", f"calls {n}", ids))
            pending += ids
        elif step == "answer" and pending:
            call = pending.pop(draw(st.integers(0, len(pending) - 1)))
            out.append(Msg("tool", f"result {n}", answers=call))
        elif step == "reply":
            out.append(Msg("assistant", draw(st.text(alphabet="xyz ", max_size=30))))
        else:
            out.append(Msg("user", draw(st.text(alphabet="uvw ", max_size=30))))
    return out


histories = st.one_of(
    conversations(),
    conversations(interject=True, system=False),
    late_answers(),
    chaotic(),
)


@dataclass
class Pending:
    """A compaction planned earlier, committed some steps later (as the engine may)."""

    lo: int
    hi: int


def check_index(index: GroupIndex, records: Sequence[MessageRecord], policy: SlidingWindow) -> None:
    """The index says what one fresh pass over its region says."""
    start, end = index.start, index.end
    assert end == len(records)
    region = records[start:end]
    if not region:
        assert index.starts == ()
        return
    starts = [s + start for s in turn_groups(region)]
    assert list(index.starts) == starts
    cum, top = index.cumulative(policy.unit)
    sizes = [b - a for a, b in zip(cum, [*cum[1:], top], strict=True)]
    assert sizes == _reference_sizes(region, [s - start for s in starts], policy)
    opened: dict[str, list[int]] = {}
    for i in range(start, end):
        for call in records[i].opens:
            opened.setdefault(call, []).append(i)
    assert {c: list(o) for c, o in index.calls.items()} == opened


@SETTINGS
@given(
    policies(small=True) | policies(),
    histories,
    st.data(),
)
def test_incremental_plan_equals_plan_from_scratch(
    policy: SlidingWindow, msgs: list[Msg], data: st.DataObject
) -> None:
    records = [record_of(m) for m in msgs]
    n = len(records)
    if data.draw(st.booleans(), label="load after every message"):
        cuts = list(range(n + 1))
    else:
        cuts = sorted(data.draw(st.sets(st.integers(0, n), max_size=n + 1)) | {n})
    state = ConversationState()
    index: GroupIndex | None = None
    pending: list[Pending] = []
    older: list[GroupIndex] = []
    for end in cuts:
        lo = needed_from(state)
        history = records[:end]
        p = plan(policy, state, history[lo:], base=lo, index=index)
        fresh = plan(policy, state, history[lo:], base=lo)
        assert p == fresh
        assert p == reference_plan(policy, state, history)
        assert not p.rewritten
        assert p.index is not None and fresh.index is not None
        check_index(p.index, history, policy)
        check_index(fresh.index, history, policy)
        assert p.index.start == max(state.window_start, p.pinned)

        # What the engine does next: deliver (may fail), commit, compact (maybe late).
        action = data.draw(
            st.sampled_from(["commit", "commit", "commit", "fail", "reset", "stale index"]),
            label="action",
        )
        index = p.index
        older.append(p.index)
        if action == "commit":
            state = advance(state, p, history)
        elif action == "reset":  # a resync: a fresh state, the same records
            state = ConversationState(generation=state.generation + 1)
        elif action == "stale index":  # any earlier plan's index of this history, or none
            index = data.draw(st.sampled_from([None, *older]), label="stale")
        if p.compact is not None:
            pending.append(Pending(*p.compact))
        if pending and data.draw(st.booleans(), label="a pending compaction commits"):
            job = data.draw(st.sampled_from(pending), label="which")
            if state.window_start == job.lo:  # the engine's compare-and-set
                state = replace(
                    state,
                    summary="s",
                    summarized=job.hi,
                    window_start=job.hi,
                    delivered=job.hi,
                    anchor=history[job.hi - 1].fingerprint,
                )
            pending.clear()


@SETTINGS
@given(histories, st.data())
def test_index_grown_in_any_chunks_equals_one_pass(msgs: list[Msg], data: st.DataObject) -> None:
    records = [record_of(m) for m in msgs]
    n = len(records)
    start = data.draw(st.integers(0, n), label="start")
    index = GroupIndex(start, start)
    at = start
    while at < n:
        nxt = data.draw(st.integers(at + 1, n), label="next end")
        base = data.draw(st.integers(0, index.end), label="base")
        index = index.extend(records[base:nxt], base=base)
        at = nxt
        check_index(index, records[:nxt], SlidingWindow.last_tokens(1))
        # Moving the start to any group start equals a fresh pass from there.
        to = data.draw(st.sampled_from([*index.starts, index.end]), label="advance to")
        moved = index.advance(to)
        assert moved is not None
        check_index(moved, records[:nxt], SlidingWindow.last_messages(1))
        fresh = GroupIndex.build(records[to:nxt], to, base=to)
        assert (moved.starts, moved.calls) == (fresh.starts, fresh.calls)
        if data.draw(st.booleans(), label="keep the moved index"):
            index = moved


def test_advance_refuses_a_start_inside_a_group() -> None:
    records = [
        record_of(m)
        for m in [
            Msg("user", "q"),
            Msg("assistant", "", opens=("x",)),
            Msg("user", "meanwhile"),
            Msg("tool", "r", answers="x"),
            Msg("user", "next"),
        ]
    ]
    index = GroupIndex.build(records, 0)
    assert index.starts == (0, 4)
    assert index.advance(2) is None  # the interjection belongs to the running group
    moved = index.advance(4)
    assert moved is not None and (moved.start, moved.starts, moved.calls) == (4, (4,), {})
    assert moved.tokens - moved.tokens_at[0] == records[4].tokens
    assert index.advance(5) == GroupIndex(5, 5, (), (), index.tokens)  # the empty end
    assert index.advance(6) is None


def test_plan_ignores_an_index_that_does_not_fit() -> None:
    policy = SlidingWindow.last_messages(3)
    records = [record_of(Msg("user" if i % 2 == 0 else "assistant", f"m{i}")) for i in range(8)]
    p = plan(policy, ConversationState(), records[:6])
    assert p.index is not None
    state = advance(ConversationState(), p, records[:6])
    # An index from a later region, or past the end, is not used (and not trusted).
    later = GroupIndex.build(records[4:8], 4, base=4)
    for index in (later, GroupIndex.build(records, 0)):
        got = plan(policy, state, records[:5], index=index)
        assert got == plan(policy, state, records[:5]) == reference_plan(policy, state, records[:5])


def test_an_unchanged_history_reads_no_records_but_the_anchor() -> None:
    """With the index, a load that appended nothing reads O(1) records, whatever the window."""
    policy = SlidingWindow.last_messages(400)
    records = [record_of(Msg("user" if i % 2 == 0 else "assistant", f"m{i}")) for i in range(600)]
    first = plan(policy, ConversationState(), records)
    state = advance(ConversationState(), first, records)

    class Counting(list[MessageRecord]):
        reads = 0

        def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
            Counting.reads += 1
            return super().__getitem__(i)

    lo = needed_from(state)
    again = plan(policy, state, Counting(records[lo:]), base=lo, index=first.index)
    assert again == plan(policy, state, records[lo:], base=lo) and Counting.reads <= 2
    assert (again.window_start, again.size) == (first.window_start, first.size)
    Counting.reads = 0
    grown = [*records, record_of(Msg("user", "new"))]
    p = plan(policy, state, Counting(grown[lo:]), base=lo, index=again.index)
    assert p == plan(policy, state, grown[lo:], base=lo) and Counting.reads <= 3


# -- the engine: its cached index changes nothing a load returns, delivers or commits -------


@SETTINGS
@given(policies(small=True) | policies(), histories, st.data())
def test_engine_with_cached_index_equals_engine_without(
    policy: SlidingWindow, msgs: list[Msg], data: st.DataObject
) -> None:
    """Appends, reloads, copies and edits of cached messages, tuples, clears: same results."""
    from demote.engine import Demoter
    from demote.hooks.simple import CallbackHook
    from tests.strategies import describer, unique

    msgs = unique(msgs)
    got: dict[str, list[tuple[int, str]]] = {"cached": [], "fresh": []}

    def sink(name: str) -> CallbackHook:
        return CallbackHook(lambda b: got[name].extend((m.index, m.key) for m in b.messages))

    cached = Demoter(policy, sink("cached"))
    fresh = Demoter(policy, sink("fresh"))
    history: list[Msg] = []
    at = 0
    for _ in range(data.draw(st.integers(1, 2 * len(msgs) + 2), label="loads")):
        op = data.draw(
            st.sampled_from(["append", "append", "append", "copy", "edit", "tuple", "clear"]),
            label="op",
        )
        if op == "append" or not history:
            take = data.draw(st.integers(1, 3), label="append how many")
            history += msgs[at : at + take]
            at += take
        elif op == "copy":  # the same content in a new object (a store that re-reads)
            i = data.draw(st.integers(0, len(history) - 1), label="copy which")
            history[i] = replace(history[i])
        elif op == "edit":  # different content: maybe a rewrite
            i = data.draw(st.integers(0, len(history) - 1), label="edit which")
            history[i] = replace(history[i], text=history[i].text + " (edited)")
        elif op == "clear":
            cached.clear("c")
            fresh.clear("c")
        fresh._views.clear()  # no cached records, no index: every plan from scratch
        seen = tuple(history) if op == "tuple" else history
        a = cached.load("c", seen, describer(cached))
        b = fresh.load("c", seen, describer(fresh))
        assert (a.start, a.total, a.demoted, a.summary) == (b.start, b.total, b.demoted, b.summary)
        assert a.messages == b.messages and a.pinned == b.pinned
        assert cached.state_of("c") == fresh.state_of("c")
        assert got["cached"] == got["fresh"]
