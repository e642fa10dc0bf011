"""Replays through the real engine: window sizes, demotions, prompt-cache cost, plots."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from demote import Bulk, CallbackHook, Compact, Demotion, PerItem, SlidingWindow
from demote.cli.replay import ReplayMeter, plot_windows, replay
from demote.cli.transcript import Transcript
from demote.errors import ConfigError, MissingExtraError


# Every text is 36 characters: 9 tokens + 3 overhead = 12 tokens a message.
def chat(n: int) -> list[tuple[str, str]]:
    return [
        ("user" if i % 2 == 0 else "assistant", f"message number {i:05d} " + "x" * 15)
        for i in range(n)
    ]


def test_message_window_sizes_and_guarantee() -> None:
    result = replay(chat(10), SlidingWindow.last_messages(4), system_prompt_tokens=0)
    assert result.calls == 5  # one per user message
    assert result.messages == 10
    # Windows at calls 1..5 (after the user message): 1, 3, 3, 3, 3 messages.
    assert result.window_messages == (1, 3)
    # Each message counts its text and role (as langchain-core counts it) and framing.
    assert result.series == (13, 41, 41, 41, 41)
    assert result.window_tokens == (13, 41)
    assert result.guaranteed_tokens == 41
    assert result.demoted == 6  # messages 0-5 have left the window by call 5
    assert result.demotions == 3
    assert result.mean_prompt_tokens == pytest.approx((13 + 4 * 41) / 5)


def test_no_guarantee_when_the_window_never_fills() -> None:
    result = replay(chat(6), SlidingWindow.last_tokens(1000))
    assert result.guaranteed_tokens is None
    assert result.demoted == 0
    assert result.steady_costs == ()
    # Append-only prompts with a 200-token head: each call re-reads the last prompt.
    assert result.cost("openai").hit_rate == 0.0  # under 1,024 tokens: never cached


def test_hook_receives_each_demoted_message_once() -> None:
    seen: list[int] = []

    def collect(batch: Demotion) -> None:
        seen.extend(m.index for m in batch.messages)

    policy = SlidingWindow.last_tokens(200, eviction=Bulk(overflow=100))
    result = replay(chat(400), policy, hook=CallbackHook(collect))
    assert seen == list(range(len(seen)))
    assert len(seen) == result.demoted > 0


def test_system_messages_are_pinned_not_counted() -> None:
    pairs = [("system", "rules " * 10), *chat(20)]
    calls: list[int] = []
    result = replay(
        Transcript(tuple(pairs)),  # type: ignore[arg-type]
        SlidingWindow.last_messages(4),
        system_prompt_tokens=0,
        on_call=lambda i, window: calls.append(i),
    )
    assert calls == list(range(1, 21, 2))
    assert result.window_messages[1] == 3
    assert result.mean_prompt_tokens > result.window_tokens[1]  # the pinned message


def test_bulk_is_cheaper_than_per_item_at_the_same_limit() -> None:
    pairs = chat(3000)
    per_item = replay(pairs, SlidingWindow.last_tokens(2000, eviction=PerItem()))
    bulk = replay(pairs, SlidingWindow.last_tokens(2000, eviction=Bulk(overflow=1000)))
    assert per_item.guaranteed_tokens is not None
    assert bulk.guaranteed_tokens is not None
    assert abs(per_item.guaranteed_tokens - bulk.guaranteed_tokens) <= 24  # one turn
    for pricing in ("anthropic", "openai"):
        assert bulk.cost(pricing).relative_cost < per_item.cost(pricing).relative_cost
        assert bulk.cost(pricing, steady=True).relative_cost < 0.6
    assert per_item.cost("anthropic", steady=True).relative_cost > 1.0
    assert bulk.window_tokens[1] <= 3000
    assert per_item.window_tokens[1] <= 2000
    with pytest.raises(KeyError):
        bulk.cost("nobody")


def test_compact_adds_a_stand_in_summary() -> None:
    policy = SlidingWindow.last_tokens(300, eviction=Compact(compact_count=100))
    base = replay(chat(200), policy, summary_tokens=0)
    with_stub = replay(chat(200), policy, summary_tokens=150)
    assert with_stub.demoted == base.demoted
    assert with_stub.mean_prompt_tokens > base.mean_prompt_tokens + 100
    assert with_stub.label == "tokens<=300, compact(100)"


def test_compact_with_a_summarizer_puts_the_summary_in_the_prompt() -> None:
    from demote.summarize import TemplateSummarizer

    policy = SlidingWindow.last_tokens(300, eviction=Compact(compact_count=100))
    seen: list[int] = []

    def collect(batch: Demotion) -> None:
        seen.extend(m.index for m in batch.messages)

    result = replay(
        chat(200),
        policy,
        summarizer=TemplateSummarizer(max_summary_tokens=80),
        hook=CallbackHook(collect),
    )
    stub = replay(chat(200), policy, summary_tokens=0)
    assert result.guaranteed_tokens is not None
    assert result.window_tokens[1] <= 300 + 2 * 100
    # Compaction cuts at limit + k, the bulk fallback only at limit + 2k: more, smaller cuts.
    assert result.demotions > stub.demotions
    # The summary is in the prompt, and it counts toward the limit like the rest of it.
    assert result.mean_prompt_tokens != stub.mean_prompt_tokens
    assert max(result.window_tokens) <= 300 + 2 * 100 + 80
    # Summarized messages still reach the hook, once each and in order; a summary that
    # commits in the final drain has delivered its messages before a load moved past them.
    assert set(range(result.demoted)) <= set(seen)
    assert seen == list(range(len(seen)))


def test_meter_for_foreign_windows() -> None:
    meter = ReplayMeter("other", keep_series=False)
    meter.record([("s", 10), ("a", 5)], window_tokens=5, window_messages=1, full=False)
    meter.record([("s", 10), ("b", 7)], window_tokens=7, window_messages=1, full=True, demoted=1)
    result = meter.result(messages=3, seconds=0.5)
    assert (result.label, result.calls, result.demoted, result.demotions) == ("other", 2, 1, 1)
    assert result.guaranteed_tokens == 7
    assert result.series == ()
    assert result.seconds == 0.5
    assert result.steady_costs[0].calls == 1


def test_bad_sizes() -> None:
    with pytest.raises(ConfigError):
        replay(chat(2), SlidingWindow.last_messages(2), system_prompt_tokens=-1)


def test_plot_windows(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results = [
        replay(chat(300), SlidingWindow.last_tokens(500, eviction=ev))
        for ev in (PerItem(), Bulk(overflow=250))
    ]
    out = tmp_path / "windows.png"
    fig = plot_windows(results, out, limit=500)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(fig.axes[0].lines) == 3


def test_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(MissingExtraError, match=r"demote\[plot\]"):
        plot_windows([])
