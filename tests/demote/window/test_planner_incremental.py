"""The planner's incremental group index: planning with ``index=`` equals planning afresh.

Replays append-then-plan like the engine (deliveries that fail, compactions that commit
late, resets) and, at every step, plans three ways over the same state and records: with
the previous plan's index, without one (over the whole history, so the opener of a turn
the window starts inside is in reach), and with the plain two-pass reference planner
(``tests.strategies.reference_plan``). All three must agree on every field, and the index
must describe exactly the groups, steps and sums a fresh pass finds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from demote.engine._compaction import _SAME
from demote.records import ConversationState, MessageRecord
from demote.window.groups import GroupIndex
from demote.window.planner import needed_from, plan, turn_groups
from demote.window.policy import ClearToolResults, PerItem, SlidingWindow
from demote.window.steps import result_costs
from tests.strategies import (
    Msg,
    advance,
    agent_histories,
    agent_policies,
    conversations,
    cut_points,
    examples,
    policies,
    record_of,
    reference_plan,
)

# Random policies include Compact without a summarizer, on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::demote.errors.DemoteWarning")

SETTINGS = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


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
    agent_histories(),
    agent_histories(max_steps=25),
)
#: Histories where every call is answered in its own turn (the reference's opener rule,
#: a pass from the start, and the index's, carried from where it was cut, then agree).
well_formed = st.one_of(conversations(), agent_histories(), agent_histories(max_steps=25))


@dataclass
class Pending:
    """A compaction planned earlier, committed some steps later (as the engine may)."""

    lo: int
    hi: int
    state: ConversationState


def check_index(index: GroupIndex, records: Sequence[MessageRecord], policy: SlidingWindow) -> None:
    """The index says what one fresh pass over its region says."""
    start, end = index.start, index.end
    assert end == len(records)
    region = records[start:end]
    if not region:
        assert index.starts == () and index.cuts == ()
        return
    costs = index.costs
    starts = [s + start for s in turn_groups(region)]
    assert list(index.starts) == starts
    assert list(index.cuts) == cut_points(records, start)
    cost = [costs.cost(r) for r in records]
    ends = [*starts[1:], end]
    assert [
        b - a for a, b in zip(index.tokens_at, [*index.tokens_at[1:], index.tokens], strict=True)
    ] == [sum(cost[s:e]) for s, e in zip(starts, ends, strict=True)]
    cuts = list(index.cuts)
    cut_ends = [*cuts[1:], end]
    spans = zip(cuts, cut_ends, strict=True)
    assert [
        b - a for a, b in zip(index.cuts_at, [*index.cuts_at[1:], index.tokens], strict=True)
    ] == [sum(cost[s:e]) for s, e in spans]
    tools = [c if r.role == "tool" else 0 for c, r in zip(cost, records, strict=True)]
    spans = zip(cuts, cut_ends, strict=True)
    assert [
        b - a for a, b in zip(index.tools_at, [*index.tools_at[1:], index.tool_tokens], strict=True)
    ] == [sum(tools[s:e]) for s, e in spans]
    users = [i for i in range(start, end) if records[i].role == "user"]
    assert list(index.users) == users
    assert list(index.user_costs) == [cost[i] for i in users]
    assert index.lead_user == (records[start].role == "user")
    saving = {i: costs.saving(records[i], cost[i]) for i in range(start, end)}
    assert list(index.clear_pos) == [i for i, v in saving.items() if v]
    saved = [index.saved_before(i) for i in range(start, end + 1)]
    assert [b - a for a, b in pairwise(saved)] == [saving[i] for i in range(start, end)]
    assert list(index.clip_pos) == [i for i in range(start, end) if costs.clipped(records[i])]
    latest = {call: i for i in range(start, end) for call in records[i].opens}
    assert dict(index.calls) == latest


def same_index(a: GroupIndex, b: GroupIndex) -> bool:
    """Equal but for the origin of the cumulative sums, and an opener one has not looked for.

    (A plan that had to read back for the opener of its region's start, and whose cut left
    that turn, does not read back.)
    """

    def rel(x: GroupIndex) -> tuple[object, ...]:
        o = x.cuts_at[0] if x.cuts else x.tokens
        t = x.tools_at[0] if x.cuts else x.tool_tokens
        v = x.saved_before(x.start)
        return (
            x.start,
            x.end,
            x.starts,
            tuple(n - o for n in x.tokens_at),
            x.tokens - o,
            dict(x.calls),
            x.costs,
            x.users,
            x.user_costs,
            x.cuts,
            tuple(n - o for n in x.cuts_at),
            tuple(n - t for n in x.tools_at),
            x.tool_tokens - t,
            x.clear_pos,
            tuple(n - v for n in x.clear_before),
            x.savings - v,
            x.clip_pos,
            x.lead_user,
        )

    def opener(x: GroupIndex) -> tuple[int | None, int] | None:
        if x.lead_user or x.start == x.end:
            return None, 0
        if x.opener is None and not x.openerless:
            return None  # not looked for: the next plan that needs it looks
        return x.opener, x.opener_tokens

    known = opener(a) is not None and opener(b) is not None
    return rel(a) == rel(b) and (not known or opener(a) == opener(b))


@SETTINGS
@given(
    policies(small=True) | policies() | agent_policies(),
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
        known = None  # a restart (no index) is told the pinned messages' tokens
        if index is None and state.window_start > state.pinned:
            known = sum(r.tokens for r in history[: state.pinned])
        p = plan(policy, state, history[lo:], base=lo, index=index, pinned_tokens=known)
        if p.needs is not None:  # no index (a restart): the opener is out of reach
            assert p.needs == 0
            p = plan(policy, state, history[p.needs :], base=p.needs)  # what the engine does
        whole = plan(policy, state, history)  # no index, every record in reach
        assert not p.rewritten
        assert p.index is not None and whole.index is not None
        check_index(p.index, history, policy)
        check_index(whole.index, history, policy)
        assert p == whole, repr((p, whole, state))
        assert same_index(p.index, whole.index), repr((p.index, whole.index, state))
        assert p.index.start == max(state.window_start, p.pinned)
        pinned_tokens = sum(r.tokens for r in history[: p.pinned])
        sliced = plan(policy, state, history[lo:], base=lo, pinned_tokens=pinned_tokens)
        if sliced != p:  # a restart: the opener is out of reach, and the plan says so
            assert sliced.needs == 0 and lo > 0

        # What the engine does next: deliver (may fail), commit, compact (maybe late).
        action = data.draw(
            st.sampled_from(["commit", "commit", "commit", "fail", "reset", "stale index"]),
            label="action",
        )
        index = p.index
        older.append(p.index)
        planned = state
        if action == "commit":
            state = advance(state, p, history)
        elif action == "reset":  # a resync: a fresh state, the same records
            state = ConversationState(generation=state.generation + 1)
        elif action == "stale index":  # any earlier plan's index of this history, or none
            index = data.draw(st.sampled_from([None, *older]), label="stale")
        if p.compact is not None:  # the job remembers the state the load meant to commit
            pending.append(Pending(*p.compact, advance(planned, p, history)))
        if pending and data.draw(st.booleans(), label="a pending compaction commits"):
            job = data.draw(st.sampled_from(pending), label="which")
            # The engine's compare-and-set: only over the state the job was planned on.
            if all(getattr(state, f) == getattr(job.state, f) for f in _SAME):
                state = replace(
                    state,
                    summary="s",
                    summarized=job.hi,
                    window_start=job.hi,
                    delivered=max(state.delivered, job.hi),
                    anchor=history[job.hi - 1].fingerprint,
                )
            pending.clear()


@SETTINGS
@given(policies(small=True) | agent_policies(), well_formed, st.data())
def test_plans_of_well_formed_histories_are_the_reference_plan(
    policy: SlidingWindow, msgs: list[Msg], data: st.DataObject
) -> None:
    """Every load of an agent replay, with its index, is what the two-pass rules say."""
    records = [record_of(m) for m in msgs]
    state = ConversationState()
    index: GroupIndex | None = None
    reserved = data.draw(st.sampled_from([0, 50]), label="reserved")
    for end in range(len(records) + 1):
        lo = needed_from(state)
        history = records[:end]
        p = plan(policy, state, history[lo:], base=lo, index=index, reserved=reserved)
        ref = reference_plan(policy, state, history, reserved)
        assert ref is not None and ref.matches(p), (ref, p)
        index = p.index
        if data.draw(st.integers(0, 4), label="deliver") > 0:
            state = advance(state, p, history)


def test_a_reserved_share_shrinks_the_default_clipping_in_the_reference_too() -> None:
    """A result between half the limit and half the room a reserved share leaves is clipped.

    Found by CI: with 50 tokens reserved (counted as one 128-token step) in a 370-token
    window, a ~180-token result is over (370 - 128) // 2 = 121 but under 370 // 2; the
    planner clips it at every load, as the reference must.
    """
    policy = SlidingWindow(
        unit="tokens",
        limit=370,
        eviction=PerItem(),
        pin_system=False,
        clearing=ClearToolResults(trigger=0, keep=1, head_tokens=0),
    )
    failed = "error: tool failed "
    msgs = [
        Msg("user", "task "),
        Msg("assistant", "", ("call_0", "call_1", "call_2")),
        Msg("tool", f"call_0 {failed}", answers="call_0", tool="search"),
        Msg("tool", f"call_1 {failed}" + "r" * 700, answers="call_1", tool="search"),
        Msg("tool", f"call_2 {failed}", answers="call_2", tool="search"),
        Msg("assistant", "", ("call_3", "call_4")),
        Msg("tool", f"call_3 {failed}", answers="call_3", tool="search"),
        Msg("tool", f"call_4 {failed}", answers="call_4", tool="search"),
        *[Msg("user", "task ")] * 3,
        Msg("assistant", "calling", ("call_5",)),
    ]
    records = [record_of(m) for m in msgs]
    state = ConversationState()
    clipped_at = []
    for end in range(len(records) + 1):
        p = plan(policy, state, records[:end], reserved=50)
        ref = reference_plan(policy, state, records[:end], 50)
        assert ref is not None and ref.matches(p), (ref, p)
        clipped_at += [end] if 3 in p.clipped else []
    assert clipped_at and clipped_at[0] == 4


@SETTINGS
@given(histories, agent_policies(), st.data())
def test_index_grown_in_any_chunks_equals_one_pass(
    msgs: list[Msg], policy: SlidingWindow, data: st.DataObject
) -> None:
    records = [record_of(m) for m in msgs]
    n = len(records)
    costs = result_costs(policy)
    start = data.draw(st.integers(0, n), label="start")
    index = GroupIndex(start, start, costs=costs)
    at = start
    while at < n:
        nxt = data.draw(st.integers(at + 1, n), label="next end")
        base = data.draw(st.integers(0, index.end), label="base")
        index = index.extend(records[base:nxt], base=base)
        at = nxt
        check_index(index, records[:nxt], policy)
        # Moving the start to any cut (group or step) equals a fresh pass from there.
        to = data.draw(st.sampled_from([*index.cuts, index.end]), label="advance to")
        moved = index.advance(to)
        assert moved is not None
        check_index(moved, records[:nxt], policy)
        fresh = GroupIndex.build(
            records[to:nxt],
            to,
            base=to,
            costs=costs,
            opener=moved.opener,
            opener_tokens=moved.opener_tokens,
            openerless=moved.openerless,
        )
        assert same_index(moved, fresh)
        if moved.start < moved.end and not moved.lead_user and moved.opener is not None:
            before = [u for u in index.users if u < to]  # the newest user message before it
            assert moved.opener == (before[-1] if before else index.opener)
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
    end = index.advance(5)  # the empty end
    assert end is not None and (end.start, end.end, end.starts, end.cuts) == (5, 5, (), ())
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
        ref = reference_plan(policy, state, records[:5])
        assert got == plan(policy, state, records[:5]) and ref is not None and ref.matches(got)


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
    from tests.strategies import describer

    # Unique texts of one width: each example is the same whatever ran before it (a global
    # serial would change their token counts, and Hypothesis could not shrink a find).
    msgs = [replace(m, text=f"#{i:03d} {m.text}") for i, m in enumerate(msgs)]
    got: dict[str, list[tuple[int, str]]] = {"cached": [], "fresh": []}

    def sink(name: str) -> CallbackHook:
        return CallbackHook(lambda b: got[name].extend((m.index, m.key) for m in b.messages))

    # The hook is called inline (no hook_wait): on a busy machine a call that outlived it
    # would make one Demoter's load return before its delivery, and the two differ by time.
    cached = Demoter(policy, sink("cached"), hook_wait=None, hook_timeout=None)
    fresh = Demoter(policy, sink("fresh"), hook_wait=None, hook_timeout=None)
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
