"""A stale, shorter copy of a history, read by a worker that never saw the newer messages.

Two Demoters on one store behave as two processes (as in tests/demote/engine/test_engine_leases.py).
In a fleet a request can read the conversation's history just before another worker's
request appends to it and commits a window start beyond its end (two turns with a
two-message window are enough). The guarantees promise that "a stale, shorter copy read by a
slow concurrent request is recognised and changes nothing". A worker that has seen the
newer messages knows them from its own view; one that has not reads the state's ``trail``
(the short fingerprints of the messages just before the window start, committed by the
worker that moved it). Without the trail it took the copy for a rewrite, re-synced (one
generation on), handed the hook again everything before its own window and committed a
state that described the shorter copy.

The multi-process tests avoid the race by reading history and state in one consistent step
(tests/support/engine_worker.py, ``Consistent``); this file pins down what happens without
it.
"""

from __future__ import annotations

from collections import Counter

from demote import Demoter, Demotion, InMemoryStateStore, SlidingWindow
from tests.strategies import Msg, describer, unique

POLICY = SlidingWindow.last_messages(2)


class Sink:
    def __init__(self) -> None:
        self.keys: Counter[str] = Counter()

    def deliver(self, batch: Demotion) -> None:
        for m in batch.messages:
            self.keys[m.key] += 1


def history(n: int) -> list[Msg]:
    return unique([Msg(("user", "assistant")[i % 2], f"m{i}") for i in range(n)])


def test_a_stale_copy_is_recognised_by_a_worker_that_saw_the_newer_messages() -> None:
    store, sink = InMemoryStateStore(), Sink()
    a = Demoter(POLICY, sink, state=store)
    full = history(14)
    a.load("c", full, describer(a))  # a saw all 14 and committed window start 12
    committed = store.get("c")
    w = a.load("c", full[:10], describer(a))  # a slow request's older copy
    assert (w.demoted, store.get("c")) == (0, committed)
    assert max(sink.keys.values()) == 1


def test_a_stale_copy_read_by_another_worker_changes_nothing() -> None:
    store, sink = InMemoryStateStore(), Sink()
    a, b = Demoter(POLICY, sink, state=store), Demoter(POLICY, sink, state=store)
    full = history(14)
    b.load("c", full[:8], describer(b))  # b served this conversation earlier (8 messages)
    a.load("c", full, describer(a))  # two turns later, through a: window start 12
    committed = store.get("c")
    assert committed is not None and committed.window_start == 12
    # b reads the history just before those two turns were appended, and the state just
    # after a committed them.
    w = b.load("c", full[:10], describer(b))
    assert store.get("c") == committed, "a stale copy committed a state"
    assert sink.keys and max(sink.keys.values()) == 1, "a stale copy re-delivered messages"
    assert w.demoted == 0
