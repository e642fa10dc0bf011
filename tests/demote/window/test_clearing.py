"""Clearing and clipping, by example: an agent's long request, and one huge tool result."""

from __future__ import annotations

import math

from demote.records import ConversationState, MessageRecord
from demote.window.clearing import (
    PLACEHOLDER_TOKENS,
    ResultCosts,
    clipped_text,
    fitting_chars,
    placeholder_text,
)
from demote.window.planner import needed_from, plan
from demote.window.policy import ClearToolResults, SlidingWindow
from demote.window.tokens import approximate_tokens
from tests.strategies import Msg, advance, check_valid, record_of


def agent_run(steps: int, result_chars: int) -> list[MessageRecord]:
    """A system prompt, one request, and ``steps`` tool steps of one call each."""
    msgs = [Msg("system", "You are an agent."), Msg("user", "Fix the failing test.")]
    for i in range(steps):
        msgs.append(Msg("assistant", f"step {i}", opens=(f"c{i}",)))
        msgs.append(Msg("tool", f"c{i} " + "x" * result_chars, answers=f"c{i}", tool="shell"))
    return [record_of(m) for m in msgs]


def replay(policy: SlidingWindow, records: list[MessageRecord], reserved: int = 0) -> list:
    """Plan after every step like the engine (index handed back, deliveries succeed)."""
    state, index, plans = ConversationState(), None, []
    for end in range(2, len(records) + 1):
        lo = needed_from(state)
        p = plan(policy, state, records[lo:end], base=lo, index=index, reserved=reserved)
        check_valid(records[:end], p)
        plans.append(p)
        index, state = p.index, advance(state, p, records[:end])
    return plans


def test_a_30_step_request_stays_within_3000_tokens_at_every_call() -> None:
    """The issue's agent: 30 results of ~1,450 tokens under last_tokens(3000)."""
    records = agent_run(30, 5800)
    assert records[3].tokens > 1450
    for policy in (
        SlidingWindow.last_tokens(3000),
        SlidingWindow(unit="tokens", limit=3000, clearing=ClearToolResults(trigger=2000, keep=1)),
    ):
        plans = replay(policy, records, reserved=200)
        for p in plans:
            assert p.size <= 3000 + p.overhang
            assert p.overhang == 0
        last = plans[-1]
        if policy.clearing is None:
            assert last.opener == 1, "the task stays in front of the kept steps"
            assert records[last.window_start].role == "assistant"
            assert last.window_start > 2, "old steps left the window"
        else:  # 29 placeholders (~40 tokens each) and the newest result fit
            assert last.window_start == 1 or last.opener == 1
    # With clearing, more steps stay visible (as placeholders) than without.
    plain = replay(SlidingWindow.last_tokens(3000), records, 200)[-1]
    cleared = replay(
        SlidingWindow(unit="tokens", limit=3000, clearing=ClearToolResults(trigger=2000, keep=1)),
        records,
        200,
    )[-1]
    assert cleared.window_start < plain.window_start
    assert cleared.placeholders and all(i < cleared.deliver_to for i in cleared.placeholders)


def test_a_21000_token_result_is_clipped_to_its_head() -> None:
    records = agent_run(1, 84_000)
    assert records[3].tokens > 21_000
    policy = SlidingWindow.last_tokens(4000)  # clipping needs no clearing stage
    p = plan(policy, ConversationState(), records)
    assert p.clipped == (3,)
    # The head (200 tokens at most) and the placeholder message as langchain-core counts it.
    tail = clipped_text("", 0, "0" * 32, "shell", records[3].tokens)
    head = 200 + math.ceil((len(tail) + len("c0") + len("tool") + len("shell")) / 4) + 3
    assert head < 200 + PLACEHOLDER_TOKENS
    assert p.size == sum(r.tokens for r in records[:3]) + head
    assert p.window_start == 1 and p.overhang == 0
    assert p.deliver_to == 4 and list(p.deliver) == [1, 2, 3]  # archived whole first
    # Under 500 tokens, the opener, call and clipped result alone are over: reported.
    small = plan(SlidingWindow.last_tokens(200), ConversationState(), records)
    assert small.clipped == (3,) and small.overhang == small.size - 200 > 0


def test_excluded_tools_and_the_newest_results_are_never_cleared() -> None:
    msgs = [Msg("user", "go")]
    for i in range(6):
        msgs.append(Msg("assistant", f"s{i}", opens=(f"c{i}",)))
        tool = "memory" if i == 0 else "shell"
        msgs.append(Msg("tool", f"c{i} " + "y" * 800, answers=f"c{i}", tool=tool))
    records = [record_of(m) for m in msgs]
    clearing = ClearToolResults(trigger=0, keep=2, exclude=("memory",), clear_at_least=1)
    p = plan(
        SlidingWindow(unit="tokens", limit=10**6, clearing=clearing), ConversationState(), records
    )
    assert p.placeholders == (4, 6, 8)  # not 2 (memory), not 10 and 12 (the newest two)
    assert p.cleared == 9 and p.deliver_to == 9
    # Below clear_at_least, nothing is cleared yet (the prefix stays for a while).
    lazy = clearing.model_copy(update={"clear_at_least": 10**6})
    q = plan(SlidingWindow(unit="tokens", limit=10**6, clearing=lazy), ConversationState(), records)
    assert q.placeholders == () and q.cleared == 0


def test_result_costs_count_placeholders_and_heads() -> None:
    costs = ResultCosts(clip_over=100, head_tokens=20, clearing=True, exclude=frozenset({"m"}))
    big = record_of(Msg("tool", "z" * 2000, answers="a", tool="x"))
    tail = clipped_text("", 0, "0" * 32, "x", big.tokens)
    assert costs.cost(big) == 20 + math.ceil((len(tail) + 1 + 4 + 1) / 4) + 3
    assert costs.clipped(big)
    shown = placeholder_text("0" * 32, "x", big.tokens)
    assert costs.placeholder(big) == math.ceil((len(shown) + 1 + 4 + 1) / 4) + 3
    assert costs.saving(big, costs.cost(big)) == costs.cost(big) - costs.placeholder(big) > 0
    tiny = record_of(Msg("tool", "z", answers="a", tool="x"))
    assert costs.saving(tiny, costs.cost(tiny)) == 0  # a placeholder would be larger
    excluded = record_of(Msg("tool", "z" * 2000, answers="a", tool="m"))
    assert costs.saving(excluded, costs.cost(excluded)) == 0


def test_a_pasted_task_counts_clipped_once_the_window_starts_inside_its_turn() -> None:
    task = "Fix the import error. " + "log line ok\n" * 2700 + "Then run the suite."
    msgs = [Msg("system", "You are an agent."), Msg("user", task)]
    for i in range(6):
        msgs.append(Msg("assistant", f"step {i}", opens=(f"c{i}",)))
        msgs.append(Msg("tool", f"c{i} " + "y" * 800, answers=f"c{i}", tool="shell"))
    records = [record_of(m) for m in msgs]
    assert records[1].tokens > 8000
    policy = SlidingWindow.last_tokens(4000)
    costs = ResultCosts(clip_over=2000)
    clipped = costs.opener(records[1])
    assert clipped < 1200 and costs.opener_clipped(records[1])
    assert costs.cost(records[1]) == records[1].tokens, "inside the window it counts whole"
    plans = replay(policy, records)
    assert plans[0].opener is None and plans[0].overhang > 0, "the live question: whole"
    for p in plans[1:]:
        assert p.opener == 1 and p.overhang == 0 and p.size <= 4000
    last = plans[-1]
    assert last.size == records[0].tokens + clipped + sum(
        r.tokens for r in records[last.window_start :]
    )


def test_fitting_chars_is_the_longest_head_or_tail_within_the_tokens() -> None:
    text = "abcdefghij" * 10
    assert fitting_chars(approximate_tokens, text, 5, False) == 20  # four characters a token
    assert fitting_chars(approximate_tokens, text, 1000, True) == len(text)
    assert fitting_chars(approximate_tokens, text, 0, False) == 0

    def words(s: str) -> int:  # a counter the first guess overshoots: bisection
        return len(s.split("-")) if s else 0

    dashed = "-".join(["ab"] * 20)
    head = fitting_chars(words, dashed, 3, False)
    tail = fitting_chars(words, dashed, 3, True)
    assert words(dashed[:head]) <= 3 < words(dashed[: head + 1])
    assert words(dashed[len(dashed) - tail :]) <= 3 < words(dashed[len(dashed) - tail - 1 :])
