"""What the engine reports: each load's events, observers, and stats.

A load's :attr:`Window.events` say what it did (demoted, delivered, failed, re-synced) with
counts and keys equal to what the hook received; observers get the same events off the
request path, in order; an observer that raises or hangs never fails or slows a load;
``stats`` and ``conversation_stats`` count what happened and what is pending.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from demote import Backoff, DemoteEvent, Demoter, Demotion, SlidingWindow
from demote.errors import ConfigError
from demote.records import Recalled
from tests.strategies import Msg, describer


class Sink:
    def __init__(self) -> None:
        self.down = False
        self.batches: list[Demotion] = []

    def deliver(self, batch: Demotion) -> None:
        if self.down:
            raise RuntimeError("sink down")
        self.batches.append(batch)


_CHAT = [Msg("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(40)]


def chat(n: int) -> list[Msg]:
    """The first ``n`` messages of one conversation (the same objects every time)."""
    return _CHAT[:n]


def make(sink: Sink, limit: int = 4) -> Demoter:
    return Demoter(SlidingWindow.last_messages(limit), sink, retry=Backoff(initial=0, maximum=0))


def test_a_load_reports_what_it_demoted_and_delivered() -> None:
    sink = Sink()
    demoter = make(sink)
    describe = describer(demoter)
    assert demoter.load("c", chat(4), describe).events == ()  # nothing to do, no event
    window = demoter.load("c", chat(8), describe)
    demoted, delivered = window.events
    assert (demoted.kind, demoted.start, demoted.end, demoted.count) == ("demoted", 0, 4, 4)
    assert demoted.tokens_before is not None and demoted.tokens_after is not None
    assert demoted.tokens_before > demoted.tokens_after > 0
    assert (delivered.kind, delivered.count) == ("delivered", 4)
    assert delivered.keys == tuple(m.key for m in sink.batches[0].messages)
    assert delivered.duration is not None and delivered.duration >= 0
    assert demoter.load("c", chat(8), describe).events == ()  # nothing new


def test_a_failed_delivery_is_reported_then_its_retry() -> None:
    sink = Sink()
    demoter = make(sink)
    describe = describer(demoter)
    sink.down = True
    window = demoter.load("c", chat(8), describe)
    assert [e.kind for e in window.events] == ["demoted", "delivery_failed"]
    failed = window.events[1]
    assert failed.error == "RuntimeError('sink down')" and failed.count == 4
    assert failed.retry_in == 0
    stats = demoter.conversation_stats("c")
    assert (stats.pending, stats.failures, stats.last_error) == (4, 1, failed.error)
    assert demoter.stats().pending == 4 and demoter.stats().failures == 1
    sink.down = False
    retry = demoter.load("c", chat(8), describe)
    assert [(e.kind, e.count, e.keys) for e in retry.events] == [("delivered", 4, failed.keys)]
    assert demoter.conversation_stats("c").pending == 0
    assert demoter.stats().pending == 0 and demoter.stats().delivered == 4


def test_a_rewritten_history_is_reported_as_resynced() -> None:
    sink = Sink()
    demoter = make(sink)
    describe = describer(demoter)
    demoter.load("c", chat(8), describe)
    rewritten = [Msg("user", f"other {i}") for i in range(6)]
    kinds = [e.kind for e in demoter.load("c", rewritten, describe).events]
    assert kinds[0] == "resynced" and "demoted" in kinds
    assert demoter.stats().resyncs == 1


class Observed:
    def __init__(self) -> None:
        self.events: list[DemoteEvent] = []
        self.cond = threading.Condition()

    def __call__(self, event: DemoteEvent) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def wait(self, n: int) -> list[DemoteEvent]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.events) >= n, timeout=10)
            return list(self.events)


def test_observers_get_every_event_in_order_and_can_leave() -> None:
    sink = Sink()
    demoter = make(sink)
    describe = describer(demoter)
    seen = Observed()
    leave = demoter.observe(seen)
    windows = [demoter.load("c", chat(n), describe) for n in (8, 10, 12)]
    expected = [e for w in windows for e in w.events]
    assert seen.wait(len(expected)) == expected
    recall = DemoteEvent.recalled("c", [Recalled("user", "hi", 1, "k1")], 0.002)
    demoter.emit(recall)
    assert seen.wait(len(expected) + 1)[-1] == recall
    leave()
    demoter.load("c", chat(14), describe)
    demoter.emit(recall)
    time.sleep(0.1)
    assert len(seen.events) == len(expected) + 1


def test_a_failing_or_slow_observer_never_fails_or_slows_a_load(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = Sink()
    demoter = make(sink)
    describe = describer(demoter)
    release = threading.Event()

    def broken(event: DemoteEvent) -> None:
        raise ValueError("observer bug")

    def slow(event: DemoteEvent) -> None:
        release.wait(5)

    after = Observed()
    demoter.observe(broken)
    demoter.observe(slow)
    demoter.observe(after)
    began = time.perf_counter()
    with caplog.at_level(logging.ERROR, logger="demote"):
        windows = [demoter.load("c", chat(n), describe) for n in range(6, 30, 2)]
        took = time.perf_counter() - began
        assert took < 2.0  # a 5-second observer did not hold these loads
        assert all(len(w) == 4 for w in windows)
        assert sum(len(b.messages) for b in sink.batches) == 24
        release.set()
        expected = [e for w in windows for e in w.events]
        assert after.wait(len(expected)) == expected  # later observers still get them
    assert "an event observer failed" in caplog.text


async def test_a_failing_observer_never_fails_an_async_load() -> None:
    sink = Sink()
    demoter = make(sink)
    describe = describer(demoter)

    def broken(event: DemoteEvent) -> None:
        raise RuntimeError("observer bug")

    demoter.observe(broken)
    windows = [await demoter.aload("c", chat(n), describe) for n in (8, 10)]
    assert [e.kind for w in windows for e in w.events] == ["demoted", "delivered"] * 2
    await asyncio.sleep(0)


def test_an_observer_must_be_callable() -> None:
    with pytest.raises(ConfigError, match="not callable"):
        make(Sink()).observe("print")  # type: ignore[arg-type]


def test_recalled_event_carries_keys_never_text() -> None:
    hits = [Recalled("user", "secret words", 3, "k3"), Recalled("assistant", "more", 4, "k4")]
    event = DemoteEvent.recalled("c", hits, 0.01)
    data = event.to_dict()
    assert (data["kind"], data["count"], data["keys"]) == ("recalled", 2, ["k3", "k4"])
    assert "secret" not in repr(data)


@pytest.mark.parametrize("unit", ["tokens", "messages"])
def test_demoted_event_counts_the_tokens_before_and_after_the_cut(unit: str) -> None:
    policy = SlidingWindow.last_tokens(40) if unit == "tokens" else SlidingWindow.last_messages(4)
    demoter = Demoter(policy)
    describe = describer(demoter)
    system = Msg("system", "You are a test.")
    history = [system, *_CHAT]
    previous = demoter.load("c", history[:3], describe)
    cuts = 0
    for n in range(4, 30):
        window = demoter.load("c", history[:n], describe)
        for event in window.events:
            if event.kind != "demoted":
                continue
            cuts += 1
            tokens = [describe(m).tokens for m in history[:n]]
            assert (event.start, event.end) == (previous.start, window.start)
            assert event.tokens_after == sum(tokens[window.start :])  # pinned not counted
            assert event.tokens_before == sum(tokens[previous.start :])
        previous = window
    assert cuts >= 5
