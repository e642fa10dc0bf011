"""Histories on which the planner's cached index once drifted from a fresh plan (issue 31).

Each was found by random-mode Hypothesis (``make fuzz``) and is kept here as the smallest
history that shows it, deterministic. :func:`replay` loads after every message like the
engine (each plan commits), and at each load plans three ways: with the previous plan's
index, afresh over the whole history, and afresh over what a restart reads (records from
``needed_from``, back to the start if the plan says it ``needs`` more). All must agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from demote.records import ConversationState
from demote.window.groups import GroupIndex
from demote.window.planner import Plan, needed_from, plan, turn_groups
from demote.window.policy import SlidingWindow
from tests.strategies import Msg, advance, record_of, reference_plan


def replay(policy: SlidingWindow, msgs: Sequence[Msg]) -> list[Plan]:
    """Load after every message, committing each plan; every way of planning agrees."""
    records = [record_of(m) for m in msgs]
    state = ConversationState()
    index: GroupIndex | None = None
    plans = []
    for end in range(len(records) + 1):
        history = records[:end]
        lo = needed_from(state)
        cached = plan(policy, state, history[lo:], base=lo, index=index)
        whole = plan(policy, state, history)
        pinned = sum(r.tokens for r in history[: state.pinned])
        restart = plan(policy, state, history[lo:], base=lo, pinned_tokens=pinned)
        if restart.needs is not None:
            restart = plan(policy, state, history[restart.needs :], base=restart.needs)
        assert cached == whole == restart, (end, cached, whole, restart)
        ref = reference_plan(policy, state, history)
        assert ref is not None and ref.matches(whole), (end, ref, whole)
        plans.append(cached)
        index = cached.index
        state = advance(state, cached, history)
    return plans


def test_a_late_result_after_the_window_moved_past_its_call() -> None:
    """(A) A user interjects, the window moves to the interjection, then the result comes.

    The cached index had the interjection open the region's turn; a pass from the start of
    the history let the late result merge it into the turn before, and named that turn's
    user message. The opener is the newest user message before the window: both agree.
    """
    msgs = [
        Msg("user", "deploy the app"),
        Msg("assistant", "", opens=("x",)),
        Msg("user", "and run the tests"),  # the window moves here: x is demoted unanswered
        Msg("tool", "built", answers="x"),  # late: its call was demoted
        Msg("assistant", "running the tests"),
        Msg("assistant", "tests pass"),
        Msg("assistant", "deployed"),
    ]
    plans = replay(SlidingWindow.last_messages(2), msgs)
    assert plans[3].window_start == 2  # the interjection opened the window
    assert [(p.window_start, p.opener) for p in plans[5:]] == [(4, 2), (5, 2), (6, 2)]


def test_a_restart_does_not_trust_the_turns_it_reads_from_the_middle() -> None:
    """(B) A restart reads from just before the window: a user message there that answers a
    call (opened before what it read) looked like a turn's start. The whole history's pass
    said it is not, and named an older opener; now both name the newest user message."""
    records = [
        record_of(m)
        for m in [
            Msg("user", "start"),
            Msg("assistant", "", opens=("x",)),
            Msg("user", "here is x", answers="x"),
            Msg("assistant", "step one"),
            Msg("assistant", "step two"),
        ]
    ]
    state = ConversationState(window_start=3, delivered=3, anchor=records[2].fingerprint)
    policy = SlidingWindow.last_messages(10)
    lo = needed_from(state)
    assert lo == 2
    short = plan(policy, state, records[lo:], base=lo, pinned_tokens=0)
    whole = plan(policy, state, records)
    assert short.needs is None and short == whole and whole.opener == 2


def test_a_result_answers_the_latest_call_with_its_id() -> None:
    """(C) A reused call id: the second result belongs to the second call.

    Bound to the id's earliest opening, it merged the two turns (so the window could not
    cut between them), and a pass over the whole history disagreed with the cached index
    on the opener of a window inside the second turn.
    """
    msgs = [
        Msg("user", "first"),
        Msg("assistant", "", opens=("x",)),
        Msg("tool", "one", answers="x"),
        Msg("user", "second"),
        Msg("assistant", "", opens=("x",)),  # the same id again
        Msg("tool", "two", answers="x"),
        Msg("assistant", "done"),
    ]
    records = [record_of(m) for m in msgs]
    assert turn_groups(records) == [0, 3]
    assert GroupIndex.build(records, 0).starts == (0, 3)
    plans = replay(SlidingWindow.last_messages(3), msgs)
    assert (plans[-1].window_start, plans[-1].opener) == (6, 3)


def test_the_opener_at_the_regions_own_start_inside_a_turn() -> None:
    """(D) An index whose region starts inside a turn names that turn's opener there too.

    It said "no opener" at its own start, so the engine, which checks the opener it shows
    for an edit, missed one made in the load after the window moved inside the turn.
    """
    records = [
        record_of(m)
        for m in [
            Msg("user", "the task"),
            Msg("assistant", "step one"),
            Msg("assistant", "step two"),
        ]
    ]
    index = GroupIndex.build(records, 0)
    moved = index.advance(1)
    assert moved is not None
    assert moved.opener_at(1) == (0, records[0].tokens)
    assert moved.opener_at(2) == (0, records[0].tokens)
    fresh = GroupIndex.build(records[1:], 1, base=1, opener=0, opener_tokens=records[0].tokens)
    assert fresh.opener_at(1) == moved.opener_at(1)


def test_an_edited_opener_is_counted_as_it_is_one_load_after_the_cut() -> None:
    """(D, through the engine) The load after a cut inside a turn sees the opener's edit.

    A Demoter that keeps its index and one that plans every load afresh see the same loads:
    a long turn cut inside, then the opener shortened (which frees room for a step).
    """
    from demote.engine import Demoter
    from tests.strategies import describer

    policy = SlidingWindow.last_tokens(80)
    task = Msg("user", "the task " + "word " * 40)
    steps = [Msg("assistant", f"step {i} " + "note " * 6) for i in range(8)]
    cached = Demoter(policy, hook_wait=None)
    fresh = Demoter(policy, hook_wait=None)
    # Cut inside the turn; then the same history (the index moves to the new start); then
    # the opener edited and one more step appended.
    loads = [[task, *steps[:6]], [task, *steps[:6]], [Msg("user", "the task"), *steps[:7]]]
    for history in loads:
        fresh._views.clear()  # no cached records, no index: every plan from scratch
        a = cached.load("c", history, describer(cached))
        b = fresh.load("c", history, describer(fresh))
        assert a.opener is history[0] and b.opener is history[0]
        assert (a.start, a.messages, a.overhang) == (b.start, b.messages, b.overhang)
        assert cached.state_of("c") == fresh.state_of("c")


def test_a_window_inside_a_turn_that_began_with_an_assistant_call() -> None:
    """(E) The history starts with an assistant's call, the user speaks, then its result.

    The result merged the user's message into the assistant's group, so the turn had "no
    user message" and the window started at an assistant message with no opener though
    the user had spoken (the engine's state machine found it). The opener is the newest
    user message before the window.
    """
    msgs = [
        Msg("assistant", "hello, looking you up", opens=("x",)),
        Msg("user", "hi, book me a table"),
        Msg("tool", "profile", answers="x"),
        Msg("assistant", "searching"),
        Msg("assistant", "found one"),
        Msg("assistant", "booked"),
    ]
    plans = replay(SlidingWindow.last_messages(2), msgs)
    inside = [p for p in plans if p.window_start > 1 and p.window_start < p.end]
    assert inside and all(p.opener == 1 for p in inside), plans
