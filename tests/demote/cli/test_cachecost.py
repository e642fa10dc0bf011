"""Prompt-cache pricing: hand-computed cases for both pricings."""

from __future__ import annotations

import pytest

from demote.cli.cachecost import (
    ANTHROPIC,
    OPENAI,
    CacheMeter,
    Pricing,
    cache_cost,
    call_costs,
    common_prefix_tokens,
)

FLAT = Pricing("flat", read=0.1, write=1.25)  # no minimum: every prefix counts


def test_common_prefix_stops_at_first_difference() -> None:
    a = [("s", 200), ("x", 10), ("y", 20)]
    assert common_prefix_tokens(a, a) == 230
    assert common_prefix_tokens(a, [("s", 200), ("x", 10), ("y", 20), ("z", 5)]) == 230
    assert common_prefix_tokens(a, [("s", 200), ("q", 10), ("y", 20)]) == 200
    assert common_prefix_tokens(a, [("q", 200), ("x", 10), ("y", 20)]) == 0
    assert common_prefix_tokens((), a) == 0


def test_hand_computed_write_and_read() -> None:
    prompts = [
        [("a", 100)],
        [("a", 100), ("b", 50)],  # 100 read at 0.1, 50 written at 1.25
        [("c", 10), ("a", 100)],  # prefix broken: all 110 written
    ]
    costs = call_costs(prompts, FLAT)
    assert [c.common_prefix for c in costs] == [0, 100, 0]
    assert [c.cached for c in costs] == [0, 100, 0]
    assert [c.cost for c in costs] == pytest.approx([125.0, 72.5, 137.5])
    total = cache_cost(prompts, FLAT)
    assert total.calls == 3
    assert total.relative_cost == pytest.approx(335 / 360)
    assert total.mean_prompt_tokens == pytest.approx(120)
    assert (total.min_prompt_tokens, total.max_prompt_tokens) == (100, 150)
    assert total.hit_rate == pytest.approx(1 / 3)
    assert total.cached_fraction == pytest.approx(100 / 360)


def test_openai_minimum_and_128_token_steps() -> None:
    assert [OPENAI.cached(n) for n in (0, 1000, 1023, 1024, 1151, 1152, 1500)] == [
        0,
        0,
        0,
        1024,
        1024,
        1152,
        1408,
    ]
    prompts = [[("s", 1500)], [("s", 1500), ("u", 100)]]
    costs = call_costs(prompts, OPENAI)
    # call 2: 1408 cached at 0.5 + 192 at full price; no write premium.
    assert costs[1].cost == pytest.approx(1408 * 0.5 + 192)
    assert cache_cost(prompts, OPENAI).relative_cost == pytest.approx((1500 + 704 + 192) / 3100)


def test_anthropic_short_prompts_are_neither_written_nor_read() -> None:
    prompts = [[("s", 500)], [("s", 500), ("u", 100)]]
    costs = call_costs(prompts, ANTHROPIC)
    assert [c.cached for c in costs] == [0, 0]
    assert [c.cost for c in costs] == [500.0, 600.0]  # no 1.25x premium either
    long = [[("s", 2000)], [("s", 2000), ("u", 100)]]
    assert [c.cost for c in call_costs(long, ANTHROPIC)] == pytest.approx([2500.0, 200.0 + 125.0])


def test_sliding_prefix_costs_more_than_a_stable_one() -> None:
    msgs = [(f"m{i}", 300) for i in range(40)]
    sliding = [[("sys", 200), *msgs[i : i + 10]] for i in range(30)]
    stable = [[("sys", 200), *msgs[: 10 + i]] for i in range(30)]
    assert cache_cost(sliding, ANTHROPIC).relative_cost == pytest.approx(1.25)
    assert cache_cost(stable, ANTHROPIC).relative_cost < 0.3
    assert cache_cost(sliding, OPENAI).relative_cost == pytest.approx(1.0)


def test_meter_count_false_warms_without_counting() -> None:
    meter = CacheMeter((FLAT,))
    assert meter.add([("a", 100)], count=False) == []
    (cost,) = meter.add([("a", 100), ("b", 10)])
    assert cost.cached == 100
    (result,) = meter.results()
    assert result.calls == 1
    assert result.relative_cost == pytest.approx((10 + 12.5) / 110)


def test_empty_sequence_and_bad_pricing() -> None:
    result = cache_cost([], ANTHROPIC)
    assert (result.calls, result.relative_cost, result.hit_rate) == (0, 1.0, 0.0)
    with pytest.raises(ValueError):
        Pricing("bad", read=-1, write=1)
    with pytest.raises(ValueError):
        Pricing("bad", read=0.1, write=1, increment=0)
