"""``clear()`` (and ``forget()``) in one worker process during another's delivery.

The victim's hook holds in the middle of the first delivery of a conversation (nothing
committed yet). Another process resets the conversation while its history becomes a new
one, whose later messages are the same words at the same places as before, so it matches
the old state at the old window start (how a stale commit used to hide the new history's
first messages). The victim then finishes: its write stands (it began before the reset),
its commit must not. Then four workers (two sync, two async) keep taking turns on the new
history: everything it demotes reaches the sink.
"""

from __future__ import annotations

import pytest

from demote import ConversationState
from tests.demote.fleet.conftest import Fleet

pytestmark = pytest.mark.slow

WORKERS = 4


@pytest.mark.parametrize("how", ["clear", "forget"])
def test_a_reset_during_another_workers_delivery_commits_nothing_stale_and_loses_nothing(
    fleet: Fleet, how: str
) -> None:
    fleet.sink.set_history("d", 0, 20)
    fleet.start("v", cids=["d"], hold={"cid": "d", "nth": 1})
    _, held = fleet.entered(["v"])
    assert held["indexes"] == list(range(18))
    fleet.start(
        "r", mode="async", cids=["d"], rounds=0, clear={"cid": "d", "length": 20, "how": how}
    )
    fleet.finish("r")
    reset = ConversationState(generation=1) if how == "clear" else None
    assert fleet.state("d") == reset  # the tombstone, or nothing at all

    fleet.release("v")
    fleet.finish("v")
    old = fleet.sink.rows("SELECT COUNT(*) FROM delivered WHERE worker = 'v'")
    assert old == [(18,)], "the write begun before the reset stands"
    assert fleet.state("d") == reset, "nothing stale committed"

    names = fleet.take_turns(["d"], workers=WORKERS, rounds=12, gap=0.02, delay=0.02)
    fleet.finish(*names)
    state = fleet.state("d")
    assert state is not None and state.generation == (1 if how == "clear" else 0)
    assert state.window_start > 20  # the new history demoted past the old window start
    fleet.assert_nothing_lost(["d"])
