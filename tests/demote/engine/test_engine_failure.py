"""The engine under failure: dead and hung sinks, saturated hook threads, config errors.

Whatever the hook does, every window obeys the policy's bound; a message that left the
window before its delivery succeeded is pending and, once the hook recovers, delivered
exactly once (in process) with nothing lost. A hung sync hook never blocks a load past
``hook_timeout``, never gets the same conversation again while its call runs, and never
takes the application's own threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest

from demote import (
    Backoff,
    Bulk,
    Compact,
    ConfigError,
    Demoter,
    DemoteWarning,
    Demotion,
    HookBusy,
    PerItem,
    SlidingWindow,
    TemplateSummarizer,
)
from tests.strategies import Msg, describer, unique, within_bound


class Sink:
    """Records every batch; can be down (raise) or hung (block until released)."""

    def __init__(self) -> None:
        self.down = False
        self.hang = threading.Event()  # set: calls block until ``release`` is set
        self.release = threading.Event()
        self.hanging_for: set[str] | None = None  # only these conversations hang
        self.lock = threading.Lock()
        self.keys: Counter[str] = Counter()
        self.indexes: dict[str, list[int]] = {}
        self.calls = 0
        self.running: Counter[str] = Counter()
        self.max_running: Counter[str] = Counter()

    def deliver(self, batch: Demotion) -> None:
        cid = batch.conversation_id
        with self.lock:
            self.calls += 1
            self.running[cid] += 1
            self.max_running[cid] = max(self.max_running[cid], self.running[cid])
        try:
            if self.down:
                raise RuntimeError("sink down")
            if self.hang.is_set() and (self.hanging_for is None or cid in self.hanging_for):
                assert self.release.wait(30), "test hook hung for 30 s"
            with self.lock:
                for m in batch.messages:
                    self.keys[m.key] += 1
                    self.indexes.setdefault(cid, []).append(m.index)
        finally:
            with self.lock:
                self.running[cid] -= 1

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.keys.values())


POLICIES = [
    SlidingWindow.last_messages(10),
    SlidingWindow.last_messages(10, eviction=Bulk(overflow=6)),
    SlidingWindow.last_messages(10, eviction=Compact(compact_count=3)),
    SlidingWindow.last_tokens(120, eviction=PerItem()),
]


def _turn(i: int) -> list[Msg]:
    return unique([Msg("user", f"question {i}"), Msg("assistant", f"answer {i}")])


def _check_bound(d: Demoter, w: Any) -> None:
    recs = [d.describe(m.role, m.text) for m in w.messages]
    assert within_bound(d.policy, recs), f"{len(w.messages)} messages over {d.policy}"


def _recovered(d: Demoter, sink: Sink, cid: str, history: list[Msg]) -> None:
    """The sink is back: one load delivers everything pending, once, in order."""
    w = d.load(cid, history, describer(d))
    assert w.pending == 0 and w.delivered == w.start
    assert sorted(sink.indexes.get(cid, [])) == list(range(w.start)), "lost or repeated"
    assert sink.duplicates() == 0


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.unit}-{p.eviction.kind}")
def test_a_dead_sink_for_1000_turns_keeps_every_window_bounded(policy: SlidingWindow) -> None:
    sink = Sink()
    sink.down = True
    summarizer = TemplateSummarizer() if isinstance(policy.eviction, Compact) else None
    d = Demoter(policy, sink, retry=Backoff(0.001, 0.01), summarizer=summarizer)
    history: list[Msg] = []
    for i in range(1000):
        history += _turn(i)
        w = d.load("c", history, describer(d))
        _check_bound(d, w)
        assert w.pending == w.start - w.delivered
    d.drain(10)
    assert w.pending > 1900 and sink.calls < 1000, "backed off, not called on every turn"
    sink.down = False
    time.sleep(0.02)  # past the backoff
    _recovered(d, sink, "c", history)


def test_a_hung_sync_hook_is_bounded_by_hook_timeout_and_called_once_at_a_time() -> None:
    sink = Sink()
    sink.hang.set()
    d = Demoter(SlidingWindow.last_messages(4), sink, hook_timeout=0.2, retry=Backoff(0.001, 0.001))
    history: list[Msg] = []
    began = time.monotonic()
    slow = 0
    for i in range(1000):
        history += _turn(i)
        t0 = time.monotonic()
        w = d.load("c", history, describer(d))
        slow += time.monotonic() - t0 > 0.1
        _check_bound(d, w)
    # Only the load that started the call waits for it (loose: a busy machine may stall
    # a few more past 0.1 s; a hook waited for on every turn would be 1,000).
    assert 1 <= slow < 20, "only the load that started the call waited for it"
    assert time.monotonic() - began < 60  # loose: a hung hook does not stall every turn
    assert sink.calls == 1 and sink.max_running["c"] == 1, "not handed the same batch again"
    sink.release.set()
    deadline = time.monotonic() + 10
    while d._delivery.gates and time.monotonic() < deadline:  # the late call finishes and lets go
        time.sleep(0.01)
    _recovered(d, sink, "c", history)
    assert sink.max_running["c"] == 1


async def test_a_hung_sync_hook_from_async_loads_never_takes_the_loops_threads() -> None:
    sink = Sink()
    sink.hang.set()
    sink.hanging_for = {"hung-0", "hung-1", "hung-2"}
    d = Demoter(SlidingWindow.last_messages(2), sink, hook_timeout=0.1, hook_threads=2)
    for n in range(3):
        w = await d.aload(f"hung-{n}", _turn(0) + _turn(1), describer(d))
        assert w.pending == 2
    assert d._delivery.runner.busy == 2, "two calls hang; the third never ran"
    assert d._delivery.runner.queued == 0, "it waited in the queue, then was withdrawn"
    # The application's own threads are free, and other conversations keep working as
    # long as a hook thread is: here none is, so their messages wait, pending, bounded.
    assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 5) == 42
    w = await d.aload("healthy", _turn(0) + _turn(1), describer(d))
    assert (w.start, w.pending) == (2, 2)
    sink.release.set()
    deadline = time.monotonic() + 10
    while d._delivery.runner.busy and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    d2 = Demoter(SlidingWindow.last_messages(2), sink, state=d.state)  # no backoff
    w = await d2.aload("healthy", _turn(0) + _turn(1), describer(d2))
    assert (w.pending, w.demoted) == (0, 2)


def test_when_every_hook_thread_is_busy_a_delivery_is_refused_and_stays_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = Sink()
    sink.hang.set()
    d = Demoter(SlidingWindow.last_messages(2), sink, hook_timeout=0.05, hook_threads=1)
    d.load("a", _turn(0) + _turn(1), describer(d))
    w = d.load("b", _turn(0) + _turn(1), describer(d))  # queued, withdrawn at hook_timeout
    assert (w.start, w.pending) == (2, 2)
    assert HookBusy.__name__ in caplog.text and "withdrawn" in caplog.text
    sink.release.set()


def test_only_the_hung_conversation_waits() -> None:
    sink = Sink()
    sink.hang.set()
    sink.hanging_for = {"hung"}
    d = Demoter(SlidingWindow.last_messages(2), sink, hook_timeout=0.1)
    d.load("hung", _turn(0) + _turn(1), describer(d))
    t0 = time.monotonic()
    history: list[Msg] = []
    for i in range(50):
        history += _turn(i)
        w = d.load("fine", history, describer(d))
        assert w.pending == 0
    assert time.monotonic() - t0 < 5  # loose
    sink.release.set()


async def test_an_async_hook_that_hangs_is_cancelled_and_retried() -> None:
    calls: list[int] = []
    hung = asyncio.Event()

    class Async:
        async def adeliver(self, batch: Demotion) -> None:
            calls.append(len(batch))
            if not hung.is_set():
                hung.set()
                await asyncio.sleep(30)

    d = Demoter(SlidingWindow.last_messages(2), Async(), hook_timeout=0.05, retry=Backoff(0, 0))
    history = _turn(0) + _turn(1)
    w = await d.aload("c", history, describer(d))
    assert (w.pending, w.demoted) == (2, 0)
    w = await d.aload("c", history, describer(d))
    assert (w.pending, w.demoted) == (0, 2) and calls == [2, 2]


def test_a_late_success_of_a_timed_out_call_is_counted() -> None:
    sink = Sink()
    sink.hang.set()
    d = Demoter(SlidingWindow.last_messages(2), sink, hook_timeout=0.05)
    history = _turn(0) + _turn(1)
    assert d.load("c", history, describer(d)).pending == 2
    sink.release.set()
    deadline = time.monotonic() + 10
    while d._delivery.gates and time.monotonic() < deadline:
        time.sleep(0.01)
    assert d.state_of("c").delivered == 2, "the call that finished late moved the watermark"
    assert d.load("c", history, describer(d)).pending == 0
    assert sink.calls == 1 and sink.duplicates() == 0


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lease_ttl", 0),
        ("lease_ttl", -1),
        ("lease_ttl", float("nan")),
        ("lease_ttl", float("inf")),
        ("lease_ttl", None),
        ("lease_ttl", "30"),
        ("lease_ttl", True),
        ("hook_timeout", 0),
        ("hook_timeout", "5"),
        ("hook_timeout", float("nan")),
        ("hook_timeout", float("inf")),
        ("max_batch", 0),
        ("max_batch", 2.5),
        ("hook_threads", 0),
        ("retry", 5),
    ],
)
def test_bad_failure_options_are_config_errors_naming_the_option(option: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=option):
        Demoter(SlidingWindow.last_messages(2), **{option: value})


@pytest.mark.parametrize(
    ("initial", "maximum"), [(-1, 1), (float("nan"), 1), (1, float("inf")), (5, 1), ("1", 2)]
)
def test_bad_backoff_is_a_config_error(initial: Any, maximum: Any) -> None:
    with pytest.raises(ConfigError, match="Backoff"):
        Backoff(initial, maximum)


def test_backoff_doubles_up_to_its_maximum() -> None:
    b = Backoff(0.5, 3)
    assert [b.delay(n) for n in range(6)] == [0, 0.5, 1, 2, 3, 3]
    assert Backoff(1, 60).delay(10_000) == 60


def test_compact_without_a_summarizer_warns_that_it_is_bulk_eviction() -> None:
    policy = SlidingWindow.last_messages(4, eviction=Compact(compact_count=2))
    with pytest.warns(DemoteWarning, match="without a summarizer"):
        Demoter(policy)
