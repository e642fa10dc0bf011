"""A stale copy's window obeys the policy's bound, however far the committed state lags.

A load whose delivery is held elsewhere (another caller of this process holds the gate,
or another worker the lease) plans its window, returns it and commits nothing; its view
has still seen the longer history. A slow request's shorter copy of that history is then
recognised as stale by the view, and was served ``[committed window_start, n)`` as it
was: with commits lagging, that is any length (a 16-thread test saw 114 messages against
``last_messages(4)``). The copy is now planned against the state, like any load.

The deterministic tests hold the lease by hand (the other worker) or block the hook past
``hook_wait`` (the other caller); the threaded one is the race as it was first seen.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import pytest

from demote import Demoter, Demotion, InMemoryStateStore, SlidingWindow
from tests.strategies import Msg, describer, record_of, unique, within_bound

POLICIES = {
    "messages": SlidingWindow.last_messages(4),
    "tokens": SlidingWindow.last_tokens(60),
    "turns": SlidingWindow.last_turns(2),
}


class Sink:
    """Counts what it is handed; optionally blocks until released (bounded)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.keys: Counter[str] = Counter()
        self.delay = delay
        self.entered = threading.Event()
        self.release = threading.Event()
        self.blocking = False
        self._lock = threading.Lock()

    def deliver(self, batch: Demotion) -> None:
        if self.blocking:
            self.entered.set()
            assert self.release.wait(10.0), "the test never released the hook"
        if self.delay:
            time.sleep(self.delay)
        with self._lock:
            for m in batch.messages:
                self.keys[m.key] += 1


def history(n: int, tag: str = "") -> list[Msg]:
    return unique(
        [Msg(("user", "assistant")[i % 2], f"message {i} " + "word " * (i % 5)) for i in range(n)],
        tag,
    )


def assert_bounded(policy: SlidingWindow, window: Any) -> None:
    recs = [record_of(m) for m in window.messages]
    assert within_bound(policy, recs), (
        f"window of {len(recs)} messages ({sum(r.tokens for r in recs)} tokens) "
        f"from {window.start} of {window.total}, policy {policy.unit} {policy.limit}"
    )


@pytest.mark.parametrize("committed_first", [True, False], ids=["lagging", "nothing-committed"])
@pytest.mark.parametrize("unit", sorted(POLICIES))
def test_a_stale_copy_behind_an_uncommitted_window_is_bounded(
    unit: str, committed_first: bool
) -> None:
    policy = POLICIES[unit]
    store, sink = InMemoryStateStore(), Sink()
    a = Demoter(policy, sink, state=store)
    Demoter(policy, sink, state=store)  # a second worker on the store: leases apply
    full = history(40)
    if committed_first:
        a.load("c", full[:10], describer(a))
    committed = store.get("c")
    delivered = Counter(sink.keys)
    # Another worker is delivering this conversation: a's loads commit nothing.
    assert store.acquire_lease("c", "another worker", 60.0) is not None
    assert_bounded(policy, a.load("c", full, describer(a)))  # a's view saw all 40
    assert store.get("c") == committed
    stale = a.load("c", full[:30], describer(a))  # a slow request's older copy
    assert_bounded(policy, stale)
    assert stale.total == 30 and stale.messages == full[stale.start : 30]
    assert (store.get("c"), stale.demoted, sink.keys) == (committed, 0, delivered)


def test_a_stale_copy_while_this_process_delivers_is_bounded() -> None:
    policy = POLICIES["messages"]
    sink = Sink()
    d = Demoter(policy, sink, hook_wait=0.05)
    full = history(40)
    sink.blocking = True
    first = d.load("c", full[:10], describer(d))  # returns after hook_wait; hook holds the gate
    assert sink.entered.is_set() and first.pending > 0
    try:
        assert_bounded(policy, d.load("c", full, describer(d)))  # gate held: no commit
        assert_bounded(policy, d.load("c", full[:30], describer(d)))
    finally:
        sink.release.set()
    d.close()


def test_sixteen_threads_on_six_conversations_see_only_bounded_windows() -> None:
    policy = SlidingWindow.last_messages(4)
    sink = Sink(delay=0.002)  # slow enough that the gate is often held
    d = Demoter(policy, sink)
    cids = [f"conv-{i}" for i in range(6)]
    histories: dict[str, list[Msg]] = {c: [] for c in cids}
    lock = threading.Lock()
    failures: list[str] = []
    start = threading.Barrier(16, timeout=30.0)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        for _ in range(40):
            cid = rng.choice(cids)
            with lock:
                histories[cid].extend(history(rng.randint(1, 3), cid))
                snapshot = list(histories[cid])
            if rng.random() < 0.5:  # another thread appends before this one loads
                time.sleep(rng.random() * 0.003)
            window = d.load(cid, snapshot, describer(d))
            recs = [record_of(m) for m in window.messages]
            if not within_bound(policy, recs):
                failures.append(f"{cid}: {len(recs)} messages of {window.total}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    assert not any(t.is_alive() for t in threads), "a worker did not finish in 60 s"
    d.close()
    assert not failures, failures[:5]
    assert max(sink.keys.values()) == 1, "a message was delivered twice"


def test_a_load_that_waited_for_the_gate_plans_again_from_what_was_committed() -> None:
    # Found by the threaded test above: with one Demoter (no leases) a load read the
    # state, another caller took the gate, delivered and committed, and the first load
    # then took the free gate and handed the hook the same messages from the state it had
    # read (its commit was refused, but the hook had them twice).
    policy = POLICIES["messages"]
    sink = Sink()
    d = Demoter(policy, sink)
    full = history(30)
    d.load("c", full[:10], describer(d))  # committed: window start 6
    entered, go = threading.Event(), threading.Event()
    plain = describer(d)

    def slow(msg: Msg) -> Any:
        if threading.current_thread() is not threading.main_thread() and not entered.is_set():
            entered.set()  # it has read the state; now the other caller runs
            assert go.wait(10.0), "the test never let the first load go on"
        return plain(msg)

    windows: list[Any] = []
    first = threading.Thread(target=lambda: windows.append(d.load("c", full[:20], slow)))
    first.start()
    try:
        assert entered.wait(10.0), "the first load never described its new messages"
        assert_bounded(policy, d.load("c", full, plain))  # delivers [6, 26) and commits
    finally:
        go.set()
        first.join(10.0)
    assert not first.is_alive() and len(windows) == 1
    assert_bounded(policy, windows[0])
    state = d.state_of("c")
    assert state is not None and state.window_start == 26
    assert sink.keys and max(sink.keys.values()) == 1, "a message was delivered twice"
    d.close()
