"""Fenced leases between workers: two Demoters sharing one store behave as two processes.

An ``InMemoryStateStore`` keeps the whole lease protocol (the service stores run the
same cases across real processes in tests/demote/state/), so these cases are exact and
fast: a hook slower than ``lease_ttl`` keeps its exclusion by renewal; a worker that
stops renewing (paused, killed) loses the conversation after the TTL, and its commit is
refused when it comes back; a sink that checks fencing tokens refuses its late write; a
clear in one worker stops another's delivery in flight; a leftover lease never makes a
window grow.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from demote import ConversationState, Demoter, Demotion, InMemoryStateStore, SlidingWindow
from tests.strategies import Msg, describer, unique

POLICY = SlidingWindow.last_messages(2)


class SharedSink:
    """One long tail shared by the workers; optionally slow, optionally fence-checking."""

    def __init__(self, *, check_fence: bool = False) -> None:
        self.check_fence = check_fence
        self.delay: dict[str, float] = {}  # worker name -> seconds, for its next call
        self.lock = threading.Lock()
        self.accepted: Counter[str] = Counter()
        self.refused = 0
        self.fences: list[int] = []
        self.highest: dict[str, int] = {}
        self.entered = threading.Event()

    def for_worker(self, name: str) -> Any:
        sink = self

        class Hook:
            def deliver(self, batch: Demotion) -> None:
                sink.entered.set()
                time.sleep(sink.delay.pop(name, 0))
                sink.write(batch)

        return Hook()

    def write(self, batch: Demotion) -> None:
        with self.lock:
            assert batch.fence is not None
            self.fences.append(batch.fence)
            cid = batch.conversation_id
            if self.check_fence and batch.fence < self.highest.get(cid, 0):
                self.refused += 1
                raise RuntimeError(f"stale writer (fence {batch.fence})")
            self.highest[cid] = max(self.highest.get(cid, 0), batch.fence)
            for m in batch.messages:
                self.accepted[m.key] += 1

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.accepted.values())


def chat(n: int, tag: str = "") -> list[Msg]:
    return unique([Msg(("user", "assistant")[i % 2], f"m{i}") for i in range(n)], tag)


def worker(store: InMemoryStateStore, sink: SharedSink, name: str, **kw: Any) -> Demoter:
    # These loads wait for their (slow) hook, to watch the lease while they do.
    kw.setdefault("hook_wait", None)
    return Demoter(POLICY, sink.for_worker(name), state=store, **kw)


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_a_hook_slower_than_the_lease_keeps_its_exclusion_by_renewal() -> None:
    store, sink = InMemoryStateStore(), SharedSink()
    a = worker(store, sink, "a", lease_ttl=0.2)
    b = worker(store, sink, "b", lease_ttl=0.2)
    msgs = chat(10)
    sink.delay["a"] = 1.0  # five times the TTL
    t, box = in_thread(lambda: a.load("c", msgs, describer(a)))
    assert sink.entered.wait(5)
    deadline = time.monotonic() + 1.0
    while t.is_alive() and time.monotonic() < deadline:
        w = b.load("c", msgs, describer(b))  # the lease is renewed: b never delivers
        assert w.demoted == 0 and len(w.messages) == 2
        time.sleep(0.02)
    t.join(5)
    assert box["value"].demoted == 8
    assert sink.duplicates() == 0 and len(sink.fences) == 1


def test_a_paused_worker_loses_its_lease_and_its_late_commit_and_write_are_refused() -> None:
    store, sink = InMemoryStateStore(), SharedSink(check_fence=True)
    a = worker(store, sink, "a", lease_ttl=0.2)
    b = worker(store, sink, "b", lease_ttl=0.2)
    a._delivery.keeper.close()  # a "paused" process: nothing renews its lease
    msgs = chat(10)
    sink.delay["a"] = 0.6
    t, box = in_thread(lambda: a.load("c", msgs, describer(a)))
    assert sink.entered.wait(5)
    time.sleep(0.3)  # past a's TTL
    w = b.load("c", msgs, describer(b))
    assert w.demoted == 8, "the next worker took over once the lease expired"
    committed = store.get("c")
    t.join(5)
    assert "error" not in box
    assert box["value"].demoted == 0, "the stale worker's write was refused by its fence"
    assert store.get("c") == committed, "and its commit too"
    assert sink.refused == 1 and sink.duplicates() == 0
    late, stale = sink.fences  # b wrote first; a's late write carried the older token
    assert stale < late


def test_without_renewal_a_slow_worker_would_deliver_twice() -> None:
    # The control for the first case: what renewal prevents.
    store, sink = InMemoryStateStore(), SharedSink()
    a = worker(store, sink, "a", lease_ttl=0.2)
    b = worker(store, sink, "b", lease_ttl=0.2)
    a._delivery.keeper.close()
    msgs = chat(10)
    sink.delay["a"] = 0.6
    t, _ = in_thread(lambda: a.load("c", msgs, describer(a)))
    assert sink.entered.wait(5)
    time.sleep(0.3)
    b.load("c", msgs, describer(b))
    t.join(5)
    assert sink.duplicates() == 8
    assert store.get("c") is not None and store.get("c").delivered == 8  # type: ignore[union-attr]


def test_clear_in_one_worker_stops_another_workers_delivery_in_flight() -> None:
    store, sink = InMemoryStateStore(), SharedSink()
    a = worker(store, sink, "a")
    b = worker(store, sink, "b")
    old = chat(10, "old")
    sink.delay["a"] = 0.3
    t, box = in_thread(lambda: a.load("c", old, describer(a)))
    assert sink.entered.wait(5)
    b.clear("c")  # the history was cleared through another worker
    t.join(5)
    assert "error" not in box
    assert store.get("c") == ConversationState(generation=1), "nothing stale committed"
    # The new history demotes from its own start: nothing lost, nothing skipped.
    new = chat(6, "new")
    w = b.load("c", new, describer(b))
    assert (w.start, w.pending, w.demoted) == (4, 0, 4)


def test_a_leftover_lease_of_a_dead_worker_never_makes_the_window_grow() -> None:
    store, sink = InMemoryStateStore(), SharedSink()
    worker(store, sink, "killed", lease_ttl=0.3)  # it took the lease, then died
    assert store.acquire_lease("c", "killed-worker", 0.3) is not None
    d = worker(store, sink, "d", lease_ttl=0.3)
    history: list[Msg] = []
    waited = False
    for i in range(200):
        history += chat(2, f"t{i}")
        w = d.load("c", history, describer(d))
        assert len(w.messages) <= 2
        if w.pending and not waited:
            time.sleep(0.35)  # the dead worker's lease runs out
            waited = True
    assert w.pending == 0 and sink.duplicates() == 0
    assert len(sink.accepted) == len(history) - 2


def test_fencing_tokens_only_grow() -> None:
    store, sink = InMemoryStateStore(), SharedSink()
    a, b = worker(store, sink, "a"), worker(store, sink, "b")
    history: list[Msg] = []
    for i in range(20):
        history += chat(2, f"f{i}")
        d = (a, b)[i % 2]
        d.load("c", history, describer(d))
    assert sink.fences == sorted(sink.fences) and len(set(sink.fences)) == len(sink.fences)
