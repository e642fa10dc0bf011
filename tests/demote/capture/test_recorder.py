from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import demote.capture as capture
from demote.capture import AsyncRecorder, Recorder, RecorderStats, current_key, dedup_key
from demote.errors import ConfigError
from demote.hooks.base import AsyncHook, Capture, SyncHook
from demote.records import CapturedTurn, DemotedMessage, Demotion

CHILD = Path(__file__).with_name("_outbox_child.py")


class Collect:
    """A sink that records (item, key) pairs; optionally slow or failing on some items."""

    def __init__(self, delay: float = 0.0, fail_on: frozenset[Any] = frozenset()) -> None:
        self.delay = delay
        self.fail_on = fail_on
        self.items: list[Any] = []
        self.keys: list[str | None] = []
        self.threads: set[int] = set()
        self.lock = threading.Lock()

    def __call__(self, item: Any) -> None:
        self.threads.add(threading.get_ident())
        if self.delay:
            time.sleep(self.delay)
        if isinstance(item, str | int) and item in self.fail_on:
            raise RuntimeError(f"sink refuses {item!r}")
        with self.lock:
            self.items.append(item)
            self.keys.append(current_key())


class Gate:
    """A sink that blocks on an event (at most ``limit`` seconds) before recording."""

    def __init__(self, limit: float = 3.0) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.limit = limit
        self.items: list[Any] = []

    def __call__(self, item: Any) -> None:
        self.entered.set()
        self.release.wait(self.limit)
        self.items.append(item)


def batch(conversation: str = "c1", n: int = 2) -> Demotion:
    messages = tuple(DemotedMessage("user", f"m{i}", i, f"{conversation}-{i}") for i in range(n))
    return Demotion(conversation, messages)


def turn(text: str = "hello", key: str = "t1") -> CapturedTurn:
    return CapturedTurn("c1", "user", text, 3, key)


def test_public_api_is_sorted_and_complete() -> None:
    assert capture.__all__ == sorted(capture.__all__)
    for name in capture.__all__:
        assert getattr(capture, name) is not None


def test_items_drain_in_order_and_stats_count_them() -> None:
    sink = Collect()
    recorder = Recorder(sink)
    for i in range(200):
        recorder.enqueue(i)
    recorder.close()
    assert sink.items == list(range(200))
    assert recorder.stats == RecorderStats(queued=200, delivered=200)


def test_enqueue_does_not_wait_for_a_slow_sink_and_close_is_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = Gate(limit=3.0)
    recorder = Recorder(sink, flush_timeout=0.5)
    started = time.monotonic()
    for i in range(3):
        recorder.enqueue(f"item {i}")
    assert time.monotonic() - started < 0.5
    assert sink.entered.wait(2)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="demote.capture"):
        recorder.close()
    assert time.monotonic() - started < 2.0
    assert recorder.stats.abandoned == 3
    assert "3 item(s) not delivered within flush_timeout=0.5 s; abandoned" in caplog.text
    # The worker finishes the item in flight, then stops: nothing after close is delivered.
    sink.release.set()
    thread = recorder._thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()
    assert sink.items == ["item 0"]


def test_a_failing_sink_never_stops_later_items(caplog: pytest.LogCaptureFixture) -> None:
    sink = Collect(fail_on=frozenset({1, 3}))
    with caplog.at_level(logging.WARNING, logger="demote.capture"):
        recorder = Recorder(sink)
        for i in range(5):
            recorder.enqueue(i)
        recorder.close()
    assert sink.items == [0, 2, 4]
    assert recorder.stats == RecorderStats(queued=5, delivered=3, failed=2)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "sink refuses 1" in warnings[0].getMessage()


def test_blank_items_and_enqueues_after_close_are_dropped() -> None:
    sink = Collect()
    recorder = Recorder(sink)
    for blank in (None, "", "  \n", batch(n=0), turn(text=" ")):
        recorder.enqueue(blank)
    assert recorder._thread is None  # blank items do not even start the worker
    recorder.enqueue("kept")
    recorder.close()
    recorder.enqueue("late")
    recorder.capture(turn())
    recorder.close()
    assert sink.items == ["kept"]
    assert recorder.stats == RecorderStats(queued=1, delivered=1, dropped=7)


def test_start_and_close_are_idempotent_with_one_worker() -> None:
    sink = Collect()
    recorder = Recorder(sink)
    recorder.start()
    recorder.start()
    recorder.enqueue("a")
    workers = [t for t in threading.enumerate() if t is recorder._thread]
    assert len(workers) == 1 and workers[0].daemon
    recorder.close()
    recorder.close()
    recorder.start()  # no restart after close
    assert recorder._thread is not None and not recorder._thread.is_alive()
    assert sink.items == ["a"]


def test_close_without_start_is_a_no_op() -> None:
    recorder = Recorder(Collect())
    recorder.close()
    recorder.enqueue("x")
    assert recorder.stats == RecorderStats(dropped=1)


def test_sink_kinds() -> None:
    class SyncSink:
        def __init__(self) -> None:
            self.items: list[Any] = []

        def deliver(self, item: Any) -> None:
            self.items.append(item)

    class AsyncOnlySink:
        def __init__(self) -> None:
            self.items: list[Any] = []

        async def adeliver(self, item: Any) -> None:
            await asyncio.sleep(0)
            self.items.append(item)

    async_items: list[Any] = []

    async def async_callable(item: Any) -> None:
        async_items.append(item)

    sync_sink, async_sink = SyncSink(), AsyncOnlySink()
    for sink in (sync_sink, async_sink, async_callable):
        with Recorder(sink) as recorder:
            recorder.enqueue("x")
            recorder.enqueue("y")
    assert sync_sink.items == async_sink.items == async_items == ["x", "y"]


def test_bad_configuration_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="sink"):
        Recorder(42)
    with pytest.raises(ConfigError, match="flush_timeout"):
        Recorder(Collect(), flush_timeout=-1)
    with pytest.raises(ConfigError, match="key"):
        Recorder(Collect()).enqueue("x", key="")


def test_recorder_is_a_demotion_hook_and_a_capture_sink() -> None:
    sink = Gate(limit=3.0)
    recorder = Recorder(sink, flush_timeout=5)
    assert isinstance(recorder, SyncHook)
    assert isinstance(recorder, Capture)
    started = time.monotonic()
    recorder.deliver(batch())
    recorder.capture(turn())
    assert time.monotonic() - started < 0.5  # deliver returned before the sink finished
    sink.release.set()
    recorder.close()
    assert sink.items == [batch(), turn()]


def test_sink_sees_the_dedup_key_of_each_item() -> None:
    sink = Collect()
    with Recorder(sink) as recorder:
        recorder.enqueue(batch())
        recorder.enqueue(turn(key="turn-key"))
        recorder.enqueue({"a": 1}, key="mine")
        recorder.enqueue("anonymous")
    assert sink.keys[:3] == [dedup_key(batch()), "turn-key", "mine"]
    assert sink.keys[3] is not None and len(sink.keys[3]) == 32
    assert dedup_key(batch()) == dedup_key(batch())  # stable across calls (and processes)
    assert dedup_key(batch("c2")) != dedup_key(batch("c1"))


@pytest.mark.parametrize("durable", [False, True])
def test_close_racing_the_worker_delivers_each_item_once(tmp_path: Path, durable: bool) -> None:
    rng = random.Random(7)
    for run in range(60):
        outbox = capture.SQLiteOutbox(tmp_path / f"race{run}.db") if durable else None
        seen: Counter[str | None] = Counter()

        def sink(item: Any, seen: Counter[str | None] = seen) -> None:
            time.sleep(rng.random() * 0.002)
            seen[current_key()] += 1

        recorder = Recorder(sink, flush_timeout=10, outbox=outbox)
        keys = [f"k{i}" for i in range(20)]
        for key in keys:
            recorder.enqueue(key, key=key)
        closers = [threading.Thread(target=recorder.close) for _ in range(3)]
        for closer in closers:
            closer.start()
        recorder.close()
        for closer in closers:
            closer.join()
        assert seen == Counter(keys), f"run {run}"
        assert recorder.stats.delivered == 20
        if outbox is not None:
            assert outbox.pending() == 0
            outbox.close()


def test_timed_out_close_and_a_restart_still_deliver_each_item_once(tmp_path: Path) -> None:
    for run in range(10):
        outbox = capture.SQLiteOutbox(tmp_path / f"restart{run}.db")
        seen: Counter[str | None] = Counter()

        def sink(item: Any, seen: Counter[str | None] = seen) -> None:
            time.sleep(0.002)
            seen[current_key()] += 1

        first = Recorder(sink, flush_timeout=0.01, outbox=outbox)
        keys = [f"k{i}" for i in range(30)]
        for key in keys:
            first.enqueue(key, key=key)
        first.close()  # times out mid-stream: the worker stops after the item in flight
        assert first._thread is not None
        first._thread.join(5)
        assert first.stats.abandoned > 0
        with Recorder(sink, outbox=outbox):
            pass  # delivers the leftovers
        assert seen == Counter(keys), f"run {run}"
        assert outbox.pending() == 0
        outbox.close()


def test_exit_time_flush_delivers_each_item_exactly_once(tmp_path: Path) -> None:
    delivered, enqueued = tmp_path / "delivered.log", tmp_path / "enqueued.log"
    args = ["exit", str(tmp_path / "unused.db"), str(delivered), str(enqueued), "60"]
    subprocess.run([sys.executable, str(CHILD), *args], check=True, timeout=60)
    keys = enqueued.read_text().splitlines()
    assert len(keys) == 60
    assert Counter(delivered.read_text().splitlines()) == Counter(keys)


# -- AsyncRecorder -------------------------------------------------------------------


async def test_async_items_drain_in_order_and_failures_do_not_stop_the_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    items: list[Any] = []

    async def sink(item: Any) -> None:
        await asyncio.sleep(0)
        if item == 3:
            raise RuntimeError("no 3")
        items.append(item)

    with caplog.at_level(logging.WARNING, logger="demote.capture"):
        async with AsyncRecorder(sink) as recorder:
            for i in range(6):
                recorder.enqueue(i)
            recorder.enqueue(None)
    recorder.enqueue(7)
    assert items == [0, 1, 2, 4, 5]
    assert recorder.stats == RecorderStats(queued=6, delivered=5, failed=1, dropped=2)
    assert "no 3" in caplog.text


async def test_async_enqueue_does_not_wait_and_aclose_is_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    entered = asyncio.Event()
    cancelled: list[bool] = []

    async def sink(item: Any) -> None:
        entered.set()
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    recorder = AsyncRecorder(sink, flush_timeout=0.5)
    started = time.monotonic()
    for i in range(3):
        recorder.enqueue(i)
    assert time.monotonic() - started < 0.5
    await asyncio.wait_for(entered.wait(), 2)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="demote.capture"):
        await recorder.aclose()
    assert time.monotonic() - started < 2.0
    assert cancelled == [True]
    assert recorder.stats.abandoned == 3
    assert "3 item(s) not delivered" in caplog.text


async def test_async_recorder_runs_a_sync_sink_in_a_thread() -> None:
    sink = Collect()
    async with AsyncRecorder(sink) as recorder:
        assert isinstance(recorder, AsyncHook)
        await recorder.adeliver(batch())
        recorder.capture(turn())
        recorder.enqueue("x", key="x")
    assert sink.items == [batch(), turn(), "x"]
    assert sink.keys == [dedup_key(batch()), "t1", "x"]
    assert threading.get_ident() not in sink.threads


async def test_async_aclose_racing_the_task_delivers_each_item_once() -> None:
    rng = random.Random(11)
    for run in range(60):
        seen: Counter[str | None] = Counter()

        async def sink(item: Any, seen: Counter[str | None] = seen) -> None:
            await asyncio.sleep(rng.random() * 0.002)
            seen[current_key()] += 1

        recorder = AsyncRecorder(sink, flush_timeout=10)
        keys = [f"k{i}" for i in range(20)]
        for key in keys:
            recorder.enqueue(key, key=key)
        await asyncio.sleep(rng.random() * 0.01)
        await asyncio.gather(recorder.aclose(), recorder.aclose(), recorder.aclose())
        assert seen == Counter(keys), f"run {run}"
        assert recorder.stats.delivered == 20


def test_async_recorder_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        AsyncRecorder(Collect()).enqueue("x")
