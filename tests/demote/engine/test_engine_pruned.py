"""``Demoter.load(pruned=...)``: a history whose front was pruned is never read there.

An adapter that removes delivered messages from its store but keeps their positions
(``DemotingMiddleware(prune_state=True)``) hands the engine a sequence that cannot give
them back. Every way a load reads further back than the state checks must stop at the
end of the absent positions: the re-plan that looks for the opener of the turn the window
starts inside (a restart, a first load in this process), a load whose state store is
down (planned from the history alone), and a stale, shorter copy. The window is the one
the whole history gets wherever the state covers it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import pytest

from demote import ConfigError, Demoter, InMemoryStateStore, SlidingWindow
from tests.strategies import Msg, describer, unique

CID = "pruned-1"


class Holey(Sequence[Msg]):
    """The history with positions ``absent`` unreadable (as a pruned agent state is)."""

    def __init__(self, messages: list[Msg], absent: range) -> None:
        self.messages = messages
        self.absent = absent

    def __len__(self) -> int:
        return len(self.messages)

    @overload
    def __getitem__(self, index: int) -> Msg: ...

    @overload
    def __getitem__(self, index: slice) -> list[Msg]: ...

    def __getitem__(self, index: int | slice) -> Msg | list[Msg]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = index + len(self) if index < 0 else index
        assert i not in self.absent, f"read pruned position {i}"
        return self.messages[index]


def long_turn(steps: int) -> list[Msg]:
    """A system message, a finished turn, then one long tool turn of ``steps`` steps."""
    out = [Msg("system", "sys"), Msg("user", "first"), Msg("assistant", "done")]
    out.append(Msg("user", "long task"))
    for s in range(steps):
        out += [Msg("assistant", f"step {s}", opens=(f"c{s}",)), Msg("tool", "r", answers=f"c{s}")]
    return unique(out)


class DownStore(InMemoryStateStore):
    """A state store that can be taken down."""

    down = False

    def get(self, conversation_id: str) -> Any:
        if self.down:
            raise ConnectionError("down")
        return super().get(conversation_id)


def _shown(window: Any) -> list[Msg]:
    return [*window.pinned, *([window.opener] if window.opener else []), *window.messages]


def test_a_restart_finds_the_opener_after_the_pruned_positions() -> None:
    history = long_turn(6)
    store = InMemoryStateStore()
    first = Demoter(SlidingWindow.last_messages(4), state=store)
    whole = first.load(CID, history, describer(first))
    assert whole.opener is history[3], "the window starts inside the long turn"
    history += unique([Msg("assistant", "step 6", opens=("c6",)), Msg("tool", "r", answers="c6")])
    # A new process (no view of the history) on the same state, the front pruned: the
    # message before the opener is the kept anchor, everything before it up to the
    # pinned head is absent.
    again = Demoter(SlidingWindow.last_messages(4), state=InMemoryStateStore())
    again.state.compare_and_set(CID, None, store.get(CID))
    pruned = range(1, 2)
    window = again.load(CID, Holey(history, pruned), describer(again), pruned=pruned)
    kept = Demoter(SlidingWindow.last_messages(4), state=InMemoryStateStore())
    kept.state.compare_and_set(CID, None, store.get(CID))
    assert _shown(window) == _shown(kept.load(CID, history, describer(kept)))
    assert window.opener is history[3]


def test_a_degraded_load_plans_after_the_pruned_positions() -> None:
    history = long_turn(6)
    store = DownStore()
    demoter = Demoter(SlidingWindow.last_messages(4), state=store)
    demoter.load(CID, history, describer(demoter))
    store.down = True
    pruned = range(1, 2)
    window = demoter.load(CID, Holey(history, pruned), describer(demoter), pruned=pruned)
    assert window.degraded
    assert window.pinned == history[:1]
    assert len(window.messages) <= 4 and window.opener is history[3]


def test_a_stale_copy_is_not_read_below_the_pruned_positions() -> None:
    history = long_turn(8)
    demoter = Demoter(SlidingWindow.last_messages(4), state=InMemoryStateStore())
    describe = describer(demoter)
    demoter.load(CID, history[:8], describe)
    demoter.load(CID, history, describe)
    assert demoter.state_of(CID).window_start > 8
    pruned = range(1, 2)
    window = demoter.load(CID, Holey(history[:8], pruned), describe, pruned=pruned)
    assert window.messages and window.messages[-1] is history[7], "its own window"
    assert demoter.state_of(CID).window_start > 8, "a stale copy changes nothing"


@pytest.mark.parametrize("pruned", [3, range(0, 4, 2), range(-1, 2), None])
def test_pruned_must_be_a_range_of_positions(pruned: Any) -> None:
    demoter = Demoter(SlidingWindow.last_messages(4))
    with pytest.raises(ConfigError, match="pruned"):
        demoter.load(CID, long_turn(1), describer(demoter), pruned=pruned)
