"""The default clipping leaves room for what every request carries (``fixed``).

A token window whose clipping size is not given sends a message over half of what the
limit leaves beside the request's fixed part (system prompt, tool definitions) clipped:
the opener and the newest step, which no cut removes, then fit beside it under the
limit. These tests run the real planner through :meth:`Demoter.load`.
"""

from __future__ import annotations

import asyncio

import pytest

from demote import ClearToolResults, ConfigError, ConversationState, Demoter, SlidingWindow
from demote.window.clearing import DEFAULT_HEAD_TOKENS
from demote.window.steps import FIXED_STEP, default_clip, result_costs
from tests.strategies import Msg, describer, unique

CID = "room"
LIMIT = 4_000


def task(result_chars: int) -> list[Msg]:
    """A pasted task of ~700 tokens, a step, and a newest step whose result is large."""
    return unique(
        [
            Msg("user", "the task: " + "fix the parser and its tests " * 100),
            Msg("assistant", "look first", opens=("c1",)),
            Msg("tool", "a listing " + "src/app.py " * 40, answers="c1"),
            Msg("assistant", "read it", opens=("c2",)),
            Msg("tool", "the file " + "y" * result_chars, answers="c2"),
        ]
    )


def sent_tokens(d: Demoter, msgs: list[Msg], reserved: int, **kw: int) -> tuple[int, object]:
    """What the request counts (reserved, the window as sent), and the window."""
    window = d.load(CID, msgs, describer(d), reserved=reserved, **kw)
    count = d.policy.resolved_counter()
    total = reserved
    shown = [] if window.opener_index is None else [window.opener_index]
    for i in [*shown, *range(window.start, window.total)]:
        text = window.replacement(i)
        total += count(text) if text is not None else describer(d)(msgs[i]).tokens
    return total, window


def test_a_result_that_fits_half_the_limit_but_not_the_room_left_is_clipped() -> None:
    # 1,700 tokens: under half the limit (2,000), over half of what a 2,000-token prompt
    # and tools leave (1,000). Sized by the limit alone, the request would be over it.
    msgs = task(6_800)
    d = Demoter(SlidingWindow.last_tokens(LIMIT))
    total, window = sent_tokens(d, msgs, reserved=2_000)
    assert 4 in window.clipped, "the newest result is sent clipped"
    assert total <= LIMIT and window.overhang == 0
    whole = Demoter(SlidingWindow.last_tokens(LIMIT))
    total0, window0 = sent_tokens(whole, msgs, reserved=2_000, fixed=0)
    assert 4 not in window0.clipped and total0 > LIMIT, "fixed=0: sized by the limit alone"


def test_a_chat_without_reserved_tokens_clips_at_half_the_limit_as_before() -> None:
    policy = SlidingWindow.last_tokens(LIMIT)
    assert result_costs(policy).clip_over == LIMIT // 2
    assert result_costs(policy, 0) is result_costs(policy)


def test_the_fixed_part_is_rounded_up_so_a_small_edit_changes_nothing_sent() -> None:
    msgs = task(6_800)
    a, b = Demoter(SlidingWindow.last_tokens(LIMIT)), Demoter(SlidingWindow.last_tokens(LIMIT))
    _, wa = sent_tokens(a, msgs, reserved=2 * FIXED_STEP * 7 + 1)
    _, wb = sent_tokens(b, msgs, reserved=2 * FIXED_STEP * 7 + FIXED_STEP - 3)
    assert wa.clipped == wb.clipped and wa.clipped, "the same clipping, byte for byte"
    policy = SlidingWindow.last_tokens(LIMIT)
    assert result_costs(policy, 1) is result_costs(policy, FIXED_STEP)
    assert result_costs(policy, FIXED_STEP + 1).clip_over == (LIMIT - 2 * FIXED_STEP) // 2


def test_the_clipping_never_goes_under_two_heads() -> None:
    policy = SlidingWindow.last_tokens(LIMIT)
    assert result_costs(policy, 10 * LIMIT).clip_over == 2 * DEFAULT_HEAD_TOKENS
    assert default_clip(300, 5_000, DEFAULT_HEAD_TOKENS) == 150, "unless half the limit is"


def test_a_given_clipping_size_is_not_resized() -> None:
    clearing = ClearToolResults(trigger=10 * LIMIT, max_result_tokens=1_900)
    policy = SlidingWindow(unit="tokens", limit=LIMIT, clearing=clearing)
    assert result_costs(policy, 3_000).clip_over == 1_900
    assert result_costs(SlidingWindow.last_messages(8), 3_000).clip_over is None


def test_growing_memory_outside_fixed_does_not_resize_the_clipping() -> None:
    # What grows call to call (memory blocks, a note) is reserved but not fixed: the
    # messages already sent keep their form, so the cached prefix holds.
    msgs = task(6_800)
    d = Demoter(SlidingWindow.last_tokens(LIMIT))
    _, first = sent_tokens(d, msgs, reserved=1_000, fixed=1_000)
    _, later = sent_tokens(d, msgs, reserved=1_600, fixed=1_000)
    assert first.clipped == later.clipped


def test_async_loads_size_the_clipping_alike() -> None:
    msgs = task(6_800)
    d = Demoter(SlidingWindow.last_tokens(LIMIT))
    window = asyncio.run(d.aload(CID, msgs, describer(d), reserved=2_000))
    assert 4 in window.clipped


@pytest.mark.parametrize("bad", [-1, 2.5, "10", True, 2_001])
def test_a_bad_fixed_is_a_config_error_and_changes_nothing(bad: object) -> None:
    d = Demoter(SlidingWindow.last_tokens(LIMIT))
    with pytest.raises(ConfigError, match="fixed"):
        d.load(CID, task(100), describer(d), reserved=2_000, fixed=bad)  # type: ignore[arg-type]
    assert d.state_of(CID) == ConversationState()
