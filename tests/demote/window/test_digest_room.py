"""The room the note of a cut has (:func:`demote.window.steps.digest_room`).

Within the note's share of the limit, never more than the limit leaves once the planned
window is sent, and the tokens the old note counted in that window given back (the new
note replaces it).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from demote import LowWater, PerItem, SlidingWindow
from demote.window.steps import digest_room, digest_tokens

POLICY = SlidingWindow.last_tokens(10_000, eviction=LowWater(digest=0.1))  # a 1,000 share


def test_the_share_bounds_the_room_when_the_window_leaves_more() -> None:
    assert digest_tokens(POLICY) == 1000
    assert digest_room(POLICY, 4000) == 1000
    assert digest_room(POLICY, 0) == 1000


def test_the_room_is_what_the_limit_leaves_when_that_is_less() -> None:
    assert digest_room(POLICY, 9600) == 400
    assert digest_room(POLICY, 10_000) == 0
    assert digest_room(POLICY, 10_300) == -300  # none: the note is left out


def test_the_old_note_tokens_are_given_back() -> None:
    """The plan's size counted the old note; the new one takes its place."""
    assert digest_room(POLICY, 9600, had=300) == 700
    assert digest_room(POLICY, 9600, had=900) == 1000  # still within the share
    assert digest_room(POLICY, 10_300, had=500) == 200


def test_no_share_no_room() -> None:
    """A window without a note's share (messages, PerItem, ``digest=0``) gives it none."""
    for policy in (
        SlidingWindow.last_messages(10),
        SlidingWindow.last_tokens(10_000, eviction=PerItem()),
        SlidingWindow.last_tokens(10_000, eviction=LowWater(digest=0.0)),
    ):
        assert digest_tokens(policy) == 0
        assert digest_room(policy, 100) <= 0


@given(
    limit=st.integers(100, 200_000),
    size=st.integers(0, 300_000),
    had=st.integers(0, 50_000),
)
def test_the_note_never_brings_the_window_over_the_limit(limit: int, size: int, had: int) -> None:
    policy = SlidingWindow.last_tokens(limit)
    room = digest_room(policy, size, had)
    assert room <= digest_tokens(policy)
    assert size - had + room <= limit  # the window without the old note, plus the new one
    assert room == min(digest_tokens(policy), limit - size + had)
