"""Within one process a message reaches the hook once, however two loads interleave.

The case: a load reads the committed state, then is held up (here: while it describes a
message) before it takes the conversation's gate; meanwhile another load of the same
history takes the gate, delivers and commits, and lets go. The first load then gets a
free gate, but its plan is against the state it read before that commit. Without a
lease (one Demoter on an in-process store) nothing else tells it the state moved on, so
it must re-read the committed state once it holds the gate, and plan again.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable

import pytest

from demote import Demoter, Demotion, SlidingWindow
from demote.records import MessageRecord
from tests.strategies import Msg, describer, unique

WAIT = 10.0  # seconds; every wait below is bounded by it


class Counting:
    """A sync hook that counts how often each key reached it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: Counter[str] = Counter()

    def deliver(self, batch: Demotion) -> None:
        with self.lock:
            self.count.update(m.key for m in batch.messages)


def held_describer(
    d: Demoter, at: Msg, entered: threading.Event, go: threading.Event
) -> Callable[[Msg], MessageRecord]:
    """``describer(d)`` that stops, once, at ``at`` until ``go`` (after the state read)."""
    plain = describer(d)
    first = [True]

    def describe(msg: Msg) -> MessageRecord:
        if msg is at and first[0]:
            first[0] = False
            entered.set()
            assert go.wait(WAIT), "the other load did not finish in time"
        return plain(msg)

    return describe


@pytest.mark.parametrize("slow", ["sync", "async"])
def test_a_load_that_read_the_state_before_another_commit_does_not_deliver_again(
    slow: str,
) -> None:
    hook = Counting()
    d = Demoter(SlidingWindow.last_messages(2), hook)
    history = unique([Msg("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(6)])
    entered, go = threading.Event(), threading.Event()
    describe = held_describer(d, history[-1], entered, go)
    results: list[object] = []

    def slow_load() -> None:
        try:
            if slow == "sync":
                results.append(d.load("c", history, describe))
            else:
                results.append(asyncio.run(d.aload("c", history, describe)))
        except BaseException as exc:
            results.append(exc)

    thread = threading.Thread(target=slow_load)
    thread.start()
    try:
        assert entered.wait(WAIT), "the slow load never reached its describe"
        fast = d.load("c", history, describer(d))  # takes the gate, delivers, commits
        assert fast.start == 4
        assert fast.demoted == 4
    finally:
        go.set()
        thread.join(WAIT)
    assert not thread.is_alive()
    (late,) = results
    assert not isinstance(late, BaseException), late
    assert late.start == 4  # type: ignore[attr-defined]
    assert late.demoted == 0  # type: ignore[attr-defined]
    assert sorted(hook.count.values()) == [1, 1, 1, 1], "a key was delivered twice"
    assert d.state_of("c").delivered == 4
    d.close()
