"""The engine on agent plans: reserved tokens, cleared and clipped tool results delivered
before their placeholders are sent, the opener, the overhang, and their events.

These tests feed the engine plans through a small *contract planner*: the real
planner's cut, plus agent fields chosen per test the way ``Plan``'s docstrings define them
(the tool results of the window but the newest ``keep`` cleared, ``deliver_to`` the
clearing watermark, the watermark read from the state when it ran past the window start),
so each engine behaviour is checked on the plan that needs it, apart from how the planner
decides. What they check is the engine's half: what is delivered, committed, shown and
reported. The planner's half is in ``tests/demote/window``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

import demote.engine._planning
import demote.engine._views
from demote import Backoff, ConfigError, ConversationState, Demoter, Demotion, SlidingWindow
from demote.engine import PROGRESS_PREFIX, render_progress
from demote.records import MessageRecord, make_key
from demote.window.clearing import PLACEHOLDER_TOKENS, placeholder_text
from demote.window.planner import Plan
from demote.window.planner import plan as real_plan
from demote.window.tokens import approximate_tokens, billed_tokens
from tests.strategies import Msg, describer, unique

CID = "agent-1"


class Hook:
    """Counts every key it is handed; can be switched to failing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deliveries: Counter[str] = Counter()
        self.indexes: list[int] = []
        self.fail = False

    def deliver(self, batch: Demotion) -> None:
        with self.lock:
            if self.fail:
                raise RuntimeError("sink is down")
            for m in batch.messages:
                self.deliveries[m.key] += 1
                self.indexes.append(m.index)


Extra = Callable[[ConversationState, Sequence[MessageRecord], int, Plan], dict[str, Any]]


def contract_planner(extra: Extra, seen: list[int] | None = None) -> Callable[..., Plan]:
    """The real plan, with the agent fields ``extra`` returns (see the module docstring)."""

    def planner(
        policy: SlidingWindow,
        state: ConversationState,
        records: Sequence[MessageRecord],
        *,
        base: int = 0,
        index: Any = None,
        reserved: int = 0,
        pinned_tokens: int | None = None,
        fixed: int | None = None,
    ) -> Plan:
        if seen is not None:
            seen.append(reserved)
        p = real_plan(
            policy,
            state,
            records,
            base=base,
            index=index,
            reserved=reserved,
            pinned_tokens=pinned_tokens,
            fixed=fixed,
        )
        if p.rewritten:
            return p
        fields = extra(state, records, base, p)
        if state.delivered > state.window_start:  # the watermark ran ahead of the start
            fields.setdefault("deliver_from", state.delivered)
        return replace(p, **fields)

    return planner


def clear_all_but(keep: int) -> Extra:
    """Clear every tool result of the window but the newest ``keep``."""

    def extra(
        state: ConversationState, records: Sequence[MessageRecord], base: int, p: Plan
    ) -> dict[str, Any]:
        results = [i for i in range(p.window_start, p.end) if records[i - base].role == "tool"]
        cleared = results[: max(0, len(results) - keep)]
        watermark = max(state.cleared, cleared[-1] + 1 if cleared else 0)
        return {
            "placeholders": tuple(i for i in results if i < watermark),
            "cleared": watermark,
            "deliver_to": watermark,
        }

    return extra


@pytest.fixture
def planner(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[..., Plan]], None]]:
    def use(fn: Callable[..., Plan]) -> None:
        monkeypatch.setattr(demote.engine._planning, "plan", fn)
        monkeypatch.setattr(demote.engine._views, "plan", fn)

    yield use


def agent_turn(steps: int, size: int = 400) -> list[Msg]:
    """One user request, then ``steps`` tool steps (a call and its result each)."""
    out = [Msg("user", "do the job")]
    for n in range(steps):
        out.append(Msg("assistant", f"step {n}", opens=(f"call-{n}",)))
        out.append(Msg("tool", f"result {n} " + "x" * size, answers=f"call-{n}"))
    out.append(Msg("assistant", "done"))
    return unique(out)


def key_of(d: Demoter, msgs: list[Msg], i: int) -> str:
    return make_key(CID, i, describer(d)(msgs[i]).fingerprint)


# -- reserved --------------------------------------------------------------------------


def test_reserved_reaches_the_planner_on_every_load(planner: Any) -> None:
    seen: list[int] = []
    planner(contract_planner(lambda s, r, b, p: {}, seen))
    d = Demoter(SlidingWindow.last_tokens(5000))
    msgs = agent_turn(3)
    d.load(CID, msgs, describer(d), reserved=1234)
    asyncio.run(d.aload(CID, msgs, describer(d), reserved=77))
    d.load(CID, msgs, describer(d))
    assert seen == [1234, 77, 0]


@pytest.mark.parametrize("bad", [-1, 2.5, "10", None, True])
def test_a_bad_reserved_is_a_config_error_and_changes_nothing(bad: object) -> None:
    d = Demoter(SlidingWindow.last_messages(2), Hook())
    msgs = agent_turn(3)
    with pytest.raises(ConfigError, match="reserved"):
        d.load(CID, msgs, describer(d), reserved=bad)  # type: ignore[arg-type]
    assert d.state_of(CID) == ConversationState()


# -- clearing ----------------------------------------------------------------------------


def test_cleared_results_reach_the_hook_once_before_their_placeholders_are_sent(
    planner: Any,
) -> None:
    planner(contract_planner(clear_all_but(2)))
    hook = Hook()
    d = Demoter(SlidingWindow.last_tokens(100_000), hook)
    msgs = agent_turn(6)
    w = d.load(CID, msgs, describer(d))
    results = [i for i, m in enumerate(msgs) if m.role == "tool"]
    cleared = results[:-2]
    assert w.start == 0, "nothing evicted: clearing alone"
    assert sorted(w.placeholders) == cleared
    for i in cleared:
        rec = describer(d)(msgs[i])
        assert w.placeholders[i] == placeholder_text(key_of(d, msgs, i), rec.tool, rec.tokens)
        assert key_of(d, msgs, i) in w.placeholders[i]
        assert hook.deliveries[key_of(d, msgs, i)] == 1
    # The watermark runs ahead of the window start: everything up to the last cleared.
    state = d.state_of(CID)
    assert (state.window_start, state.cleared, state.delivered) == (
        0,
        cleared[-1] + 1,
        cleared[-1] + 1,
    )
    assert w.delivered == cleared[-1] + 1 and w.pending == 0
    assert w.messages == msgs, "the messages themselves are the stored ones"
    (event,) = [e for e in w.events if e.kind == "cleared"]
    assert event.keys == tuple(key_of(d, msgs, i) for i in cleared)
    # What each placeholder message counts, as sent (its text, id, role and tool name).
    sent = [
        billed_tokens(
            w.placeholders[i], approximate_tokens, answers=r.answers, role="tool", name=r.tool
        )
        for i in cleared
        for r in [describer(d)(msgs[i])]
    ]
    assert event.tokens_after == sum(sent) and all(t <= PLACEHOLDER_TOKENS + 20 for t in sent)
    assert event.tokens_before == sum(describer(d)(msgs[i]).tokens for i in cleared)

    # More steps: only what is newly cleared is delivered; nothing twice, nothing reported twice.
    more = msgs + agent_turn(3)[1:]
    w2 = d.load(CID, more, describer(d))
    assert max(hook.deliveries.values()) == 1
    assert sorted(hook.indexes) == list(range(d.state_of(CID).delivered))
    (event2,) = [e for e in w2.events if e.kind == "cleared"]
    assert event2.start >= cleared[-1] + 1
    again = d.load(CID, more, describer(d))
    assert not [e for e in again.events if e.kind == "cleared"]
    assert max(hook.deliveries.values()) == 1


def test_a_failed_delivery_still_sends_the_placeholder_and_keeps_the_content_pending(
    planner: Any,
) -> None:
    planner(contract_planner(clear_all_but(1)))
    hook = Hook()
    hook.fail = True
    d = Demoter(SlidingWindow.last_tokens(100_000), hook, retry=Backoff(initial=0, maximum=0))
    msgs = agent_turn(4)
    w = d.load(CID, msgs, describer(d))
    cleared = [i for i, m in enumerate(msgs) if m.role == "tool"][:-1]
    assert sorted(w.placeholders) == cleared, "the bound wins: placeholders are sent"
    assert w.pending == cleared[-1] + 1 and w.delivered == 0
    kinds = [e.kind for e in w.events]
    assert "delivery_failed" in kinds and "cleared" in kinds
    state = d.state_of(CID)
    assert (state.cleared, state.delivered) == (cleared[-1] + 1, 0)

    hook.fail = False
    w2 = d.load(CID, msgs, describer(d))
    assert w2.pending == 0 and w2.delivered == cleared[-1] + 1
    assert sorted(hook.indexes) == list(range(cleared[-1] + 1))
    assert max(hook.deliveries.values()) == 1
    assert not [e for e in w2.events if e.kind == "cleared"], "reported when it was cleared"


def test_clearing_with_the_noop_hook_moves_the_watermark_to_the_clearing_end(
    planner: Any,
) -> None:
    planner(contract_planner(clear_all_but(1)))
    d = Demoter(SlidingWindow.last_tokens(100_000))
    msgs = agent_turn(4)
    w = d.load(CID, msgs, describer(d))
    assert w.pending == 0 and d.state_of(CID).delivered == max(w.placeholders) + 1


def test_a_placeholder_is_made_once_per_position_and_message(planner: Any) -> None:
    planner(contract_planner(clear_all_but(0)))
    d = Demoter(SlidingWindow.last_tokens(100_000))
    msgs = agent_turn(5)
    first = d.load(CID, msgs, describer(d)).placeholders
    second = d.load(CID, [*msgs, Msg("user", "thanks")], describer(d)).placeholders
    assert second == first
    assert all(second[i] is first[i] for i in first), "cached, not rebuilt"


# -- clipping, the opener, the overhang ---------------------------------------------------


def test_a_clipped_result_is_sent_as_its_head_and_a_placeholder(planner: Any) -> None:
    msgs = agent_turn(2, size=20_000)
    big = 2  # the first result

    def extra(
        state: ConversationState, records: Sequence[MessageRecord], base: int, p: Plan
    ) -> dict[str, Any]:
        return {"clipped": (big,), "deliver_to": big + 1}

    planner(contract_planner(extra))
    hook = Hook()
    policy = SlidingWindow.last_tokens(100_000)
    d = Demoter(policy, hook)
    w = d.load(CID, msgs, describer(d))
    text = w.clipped[big]
    head = text.split("\n[", 1)[0]
    assert msgs[big].text.startswith(head)
    assert len(head) == 4 * 200, "the default head: 200 tokens of the approximate counter"
    assert key_of(d, msgs, big) in text and "clipped" in text
    assert w.replacement(big) == text and w.replacement(big - 1) is None
    assert hook.deliveries[key_of(d, msgs, big)] == 1
    assert d.state_of(CID).delivered == big + 1
    (event,) = [e for e in w.events if e.kind == "cleared"]
    assert event.keys == (key_of(d, msgs, big),)


def test_the_head_fits_a_counter_that_counts_more_than_the_approximation(planner: Any) -> None:
    msgs = agent_turn(1, size=5_000)

    def extra(
        state: ConversationState, records: Sequence[MessageRecord], base: int, p: Plan
    ) -> dict[str, Any]:
        return {"clipped": (2,), "deliver_to": 3}

    planner(contract_planner(extra))

    def per_char(text: str) -> int:
        return len(text)

    d = Demoter(SlidingWindow.last_tokens(100_000, counter=per_char))
    head = d.load(CID, msgs, describer(d)).clipped[2].split("\n[", 1)[0]
    assert per_char(head) <= 200 and per_char(head) >= 199


def test_the_opener_is_delivered_and_shown_when_the_window_starts_inside_a_turn(
    planner: Any,
) -> None:
    msgs = agent_turn(6)
    start = 7  # a step boundary: the assistant message of step 3

    def extra(
        state: ConversationState, records: Sequence[MessageRecord], base: int, p: Plan
    ) -> dict[str, Any]:
        return {"window_start": start, "opener": 0, "deliver_to": start}

    planner(contract_planner(extra))
    hook = Hook()
    d = Demoter(SlidingWindow.last_tokens(100_000), hook)
    w = d.load(CID, msgs, describer(d))
    assert w.opener is msgs[0] and w.opener_index == 0
    assert w.messages == msgs[start:] and len(w) == 1 + len(msgs) - start
    assert sorted(hook.indexes) == list(range(start)), "the opener went to the hook too"
    assert d.state_of(CID).window_start == start


def test_an_overhang_is_reported_on_every_load_that_has_one(planner: Any) -> None:
    planner(contract_planner(lambda s, r, b, p: {"overhang": 321}))
    d = Demoter(SlidingWindow.last_tokens(100_000))
    msgs = agent_turn(2)
    for _ in range(2):
        w = d.load(CID, msgs, describer(d))
        assert w.overhang == 321
        (event,) = [e for e in w.events if e.kind == "overhang"]
        assert (event.tokens_after, event.start, event.end) == (321, w.start, len(msgs))


def test_the_progress_note_names_the_summary() -> None:
    assert render_progress("read 3 files") == PROGRESS_PREFIX + "read 3 files"


# -- sync and async alike, and the inner history is untouched ------------------------------


def test_async_loads_deliver_and_show_the_same(planner: Any) -> None:
    planner(contract_planner(clear_all_but(1)))
    msgs = agent_turn(5)
    windows = []
    for flavour in ("sync", "async"):
        hook = Hook()
        d = Demoter(SlidingWindow.last_tokens(100_000), hook)
        if flavour == "sync":
            w = d.load(CID, msgs, describer(d))
        else:
            w = asyncio.run(d.aload(CID, msgs, describer(d)))
        windows.append((w.placeholders, w.delivered, sorted(hook.indexes)))
    assert windows[0] == windows[1]


def test_the_history_is_never_changed(planner: Any) -> None:
    planner(contract_planner(clear_all_but(0)))
    msgs = agent_turn(4)
    before = [replace(m) for m in msgs]
    d = Demoter(SlidingWindow.last_tokens(100_000), Hook())
    d.load(CID, msgs, describer(d))
    assert all(a.same(b) for a, b in zip(msgs, before, strict=True))


def test_the_clearing_watermark_and_a_watermark_past_the_start_survive_a_restart(
    planner: Any, tmp_path: Any
) -> None:
    from demote import SQLiteStateStore

    planner(contract_planner(clear_all_but(1)))
    hook = Hook()
    msgs = agent_turn(5)
    store = SQLiteStateStore(tmp_path / "state.db")
    d = Demoter(SlidingWindow.last_tokens(100_000), hook, state=store)
    first = d.load(CID, msgs, describer(d))
    committed = d.state_of(CID)
    assert committed.delivered > committed.window_start
    d.close()
    store.close()
    store = SQLiteStateStore(tmp_path / "state.db")
    d = Demoter(SlidingWindow.last_tokens(100_000), hook, state=store)
    assert d.state_of(CID) == committed
    again = d.load(CID, msgs, describer(d))
    assert again.placeholders == first.placeholders
    assert max(hook.deliveries.values()) == 1, "nothing delivered again after the restart"
    store.close()


def test_a_stale_copy_is_sent_placeholders_too(planner: Any) -> None:
    planner(contract_planner(clear_all_but(1)))
    d = Demoter(SlidingWindow.last_tokens(100_000), Hook())
    msgs = agent_turn(6)
    d.load(CID, msgs, describer(d))
    before = d.state_of(CID)
    stale = msgs[:9]  # read by a slow request before the last steps were appended
    w = d.load(CID, stale, describer(d))
    results = [i for i, m in enumerate(stale) if m.role == "tool"]
    assert set(results[:-1]) <= set(w.placeholders)
    assert d.state_of(CID) == before


def test_compacting_steps_keeps_the_opener_and_shows_the_summary_with_it(planner: Any) -> None:
    from demote.window.policy import Compact

    msgs = agent_turn(6)
    hi = 7  # a step boundary inside the turn

    def extra(
        state: ConversationState, records: Sequence[MessageRecord], base: int, p: Plan
    ) -> dict[str, Any]:
        if state.summarized:  # the summary covers [1, hi): the window starts there
            return {"window_start": state.window_start, "opener": 0}
        return {"compact": (1, hi)}

    planner(contract_planner(extra))

    class Notes:
        def __init__(self) -> None:
            self.seen: list[list[str]] = []

        def summarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
            self.seen.append([m.text for m in messages])
            return "fetched pages 0-2"

    notes, hook = Notes(), Hook()
    policy = SlidingWindow(unit="tokens", limit=100_000, eviction=Compact(compact_count=10))
    d = Demoter(policy, hook, summarizer=notes)
    first = d.load(CID, msgs, describer(d))
    assert first.opener is None and first.summary is None
    assert d.drain(10), "the summary was not written in time"
    assert notes.seen == [[m.text for m in msgs[1:hi]]], "the opener is not summarized away"
    state = d.state_of(CID)
    assert (state.window_start, state.summarized, state.summary) == (hi, hi, "fetched pages 0-2")
    w = d.load(CID, msgs, describer(d))
    assert (w.opener, w.summary, w.start) == (msgs[0], "fetched pages 0-2", hi)
    assert sorted(hook.indexes) == list(range(hi)), "the summarized steps and the opener archived"
    assert max(hook.deliveries.values()) == 1


def test_an_edited_opener_is_counted_again_by_a_demoter_that_kept_the_turn() -> None:
    """The opener is shown but lies before the anchor the state checks: when it is edited,
    a Demoter holding the turn's index plans the same window as one planning afresh."""
    policy = SlidingWindow.last_tokens(40)
    steps = [
        m
        for n in range(3)
        for m in (
            Msg("assistant", f"step {n}", opens=(f"c{n}",)),
            Msg("tool", f"result {n} " + "r" * 40, answers=f"c{n}"),
        )
    ]
    history = unique([Msg("user", "go"), *steps])
    kept, afresh = Demoter(policy), Demoter(policy)
    for d in (kept, afresh):
        w = d.load("c", history, describer(d))
    assert w.start > 1 and w.opener == history[0], "the window starts inside the turn"
    history[0] = replace(history[0], text=history[0].text + " and " + "much more " * 20)
    history += unique([Msg("assistant", "done")])
    afresh._views.clear()
    a = kept.load("c", history, describer(kept))
    b = afresh.load("c", history, describer(afresh))
    assert (a.start, a.opener, a.overhang) == (b.start, b.opener, b.overhang)
    assert kept.state_of("c") == afresh.state_of("c")


def test_an_edited_system_prompt_is_counted_again_by_a_demoter_that_kept_the_window() -> None:
    """The pinned head is shown but lies before the anchor the state checks: after an
    edit of it, a Demoter holding the window's index plans what one planning afresh does."""
    policy = SlidingWindow.last_tokens(60)
    history = unique(
        [Msg("system", "be brief")]
        + [Msg(("user", "assistant")[i % 2], f"turn {i} " + "w" * 30) for i in range(6)]
    )
    kept, afresh = Demoter(policy), Demoter(policy)
    for d in (kept, afresh):
        d.load("c", history, describer(d))
    assert kept.state_of("c").window_start > 1, "something was demoted"
    history[0] = replace(history[0], text=history[0].text + " and " + "always polite " * 10)
    afresh._views.clear()
    a = kept.load("c", history, describer(kept))
    b = afresh.load("c", history, describer(afresh))
    assert (a.start, a.demoted, a.overhang) == (b.start, b.demoted, b.overhang)
    assert kept.state_of("c") == afresh.state_of("c")
