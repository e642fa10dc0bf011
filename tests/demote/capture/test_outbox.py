from __future__ import annotations

import asyncio
import gc
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from demote.capture import (
    AsyncRecorder,
    Recorder,
    RecorderStats,
    RetryPolicy,
    SQLiteOutbox,
    current_key,
    dedup_key,
)
from demote.capture.codec import decode, encode
from demote.capture.dispatch import STOP, Deliver, Dispatcher, Envelope, Verdict, Wait
from demote.capture.outbox import CheckpointStats
from demote.errors import ConfigError, StoreError
from demote.records import CapturedTurn, DemotedMessage, Demotion

CHILD = Path(__file__).with_name("_outbox_child.py")
FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)


class Flaky:
    """Fails the first ``failures`` attempts at each item, then records it."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.attempts: Counter[str | None] = Counter()
        self.items: list[Any] = []

    def __call__(self, item: Any) -> None:
        key = current_key()
        self.attempts[key] += 1
        if self.attempts[key] <= self.failures:
            raise RuntimeError(f"attempt {self.attempts[key]} refused")
        self.items.append(item)


def wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def lines(path: Path) -> list[str]:
    """Complete lines only: a kill -9 may cut the last one short."""
    if not path.exists():
        return []
    text = path.read_text()
    return text.split("\n")[:-1]


# -- codec -----------------------------------------------------------------------------


def test_records_round_trip_without_raw() -> None:
    demotion = Demotion(
        "c1",
        (
            DemotedMessage("user", "hi ✓", 0, "k0", raw=object()),
            DemotedMessage("tool", "42", 1, "k1"),
        ),
    )
    back = decode(encode(demotion))
    assert back == demotion  # raw is not compared...
    assert all(m.raw is None for m in back.messages)  # ...and not persisted
    captured = CapturedTurn("c1", "user", "remember me", 4, "tk")
    assert decode(encode(captured)) == captured
    assert decode(encode({"a": [1, 2.5, None, "x"]})) == {"a": [1, 2.5, None, "x"]}


@pytest.mark.parametrize("bad", [object(), {"n": float("nan")}, {1, 2}, b"bytes"])
def test_unserialisable_items_are_refused_at_enqueue(tmp_path: Path, bad: Any) -> None:
    with SQLiteOutbox(tmp_path / "o.db") as outbox:
        recorder = Recorder(Flaky(), outbox=outbox)
        with pytest.raises(ConfigError, match="cannot serialise"):
            recorder.enqueue(bad)
        recorder.close()
        assert outbox.pending() == 0
        assert recorder.stats == RecorderStats()


def test_unserialisable_items_are_fine_without_an_outbox() -> None:
    sink = Flaky()
    marker = object()
    with Recorder(sink) as recorder:
        recorder.enqueue(marker)
    assert sink.items == [marker]


# -- the dispatcher (sans-I/O) --------------------------------------------------------


def test_retry_policy_backs_off_exponentially_up_to_a_cap() -> None:
    policy = RetryPolicy(max_attempts=9, base_delay=0.5, max_delay=3)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    with pytest.raises(ConfigError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ConfigError):
        RetryPolicy(base_delay=2, max_delay=1)


def test_dispatcher_schedules_retries_and_stops_after_what_was_queued() -> None:
    d = Dispatcher(RetryPolicy(max_attempts=2, base_delay=10, max_delay=10))
    a, b = Envelope("a", "A"), Envelope("b", "B")
    for envelope in (a, b):
        d.accepted()
        d.receive(envelope)
    assert d.next_step(0) == Deliver(a)
    retry = d.settle(a, RuntimeError("x"), now=0)
    assert (retry.verdict, retry.envelope.attempts, retry.delay) == (Verdict.RETRY, 1, 10)
    assert d.next_step(1) == Deliver(b)  # a waits for its backoff; b is not held up
    assert d.settle(b, None, now=1).verdict is Verdict.ACK
    assert d.next_step(2) == Wait(8)
    assert d.next_step(10) == Deliver(retry.envelope)
    bury = d.settle(retry.envelope, RuntimeError("y"), now=10)
    assert (bury.verdict, bury.envelope.attempts) == (Verdict.BURY, 2)
    d.receive(STOP)
    assert d.next_step(11) is None
    assert d.stats == RecorderStats(queued=2, delivered=1, failed=1, retried=1)


def test_dispatcher_without_retries_drops_and_stop_leaves_backoff_items() -> None:
    plain = Dispatcher()
    plain.accepted()
    assert plain.settle(Envelope("a", 1), RuntimeError(), now=0).verdict is Verdict.DROP
    d = Dispatcher(RetryPolicy(base_delay=5, max_delay=5))
    d.accepted()
    d.settle(Envelope("a", 1), RuntimeError(), now=0)
    d.receive(STOP)
    assert d.next_step(1) is None  # the retry stays in the outbox for the next start
    assert d.abandon() == 1


# -- SQLite outbox ---------------------------------------------------------------------


def test_delivered_items_leave_the_outbox(tmp_path: Path) -> None:
    with SQLiteOutbox(tmp_path / "o.db") as outbox:
        sink = Flaky()
        with Recorder(sink, outbox=outbox) as recorder:
            recorder.enqueue({"n": 1}, key="one")
            recorder.deliver(Demotion("c1", (DemotedMessage("user", "m", 0, "k0"),)))
        assert outbox.pending() == 0
        assert sink.items[0] == {"n": 1}
        assert sink.items[1].messages[0].raw is None  # the sink sees the durable form


def test_leftovers_are_delivered_first_on_start(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    with SQLiteOutbox(path) as outbox:
        blocked = threading.Event()
        first = Recorder(lambda item: blocked.wait(5), flush_timeout=0.05, outbox=outbox)
        for i in range(3):
            first.enqueue(f"old {i}", key=f"old{i}")
        first.close()
        assert outbox.pending() == 3
        blocked.set()
        assert first._thread is not None
        first._thread.join(5)
        assert outbox.pending() == 2  # the item in flight finished and was acked
    with SQLiteOutbox(path) as outbox:
        sink = Flaky()
        with Recorder(sink, outbox=outbox) as second:
            second.enqueue("new", key="new")
        assert sink.items == ["old 1", "old 2", "new"]
        assert second.stats == RecorderStats(queued=3, delivered=3)
        assert outbox.pending() == 0


def test_failed_items_are_retried_with_backoff(tmp_path: Path) -> None:
    with SQLiteOutbox(tmp_path / "o.db", retry=FAST) as outbox:
        sink = Flaky(failures=2)
        recorder = Recorder(sink, outbox=outbox)
        for i in range(3):
            recorder.enqueue(i, key=f"k{i}")
        wait_for(lambda: len(sink.items) == 3)
        recorder.close()
        assert sorted(sink.items) == [0, 1, 2]
        assert sink.attempts == Counter({"k0": 3, "k1": 3, "k2": 3})
        assert recorder.stats == RecorderStats(queued=3, delivered=3, retried=6)
        assert outbox.pending() == 0
        assert outbox.dead_letters() == []


def test_items_that_keep_failing_become_dead_letters_and_can_be_replayed(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    with SQLiteOutbox(path, retry=FAST) as outbox:
        always = Flaky(failures=99)
        recorder = Recorder(always, outbox=outbox)
        recorder.enqueue(CapturedTurn("c1", "user", "keep me", 1, "tk"))
        recorder.enqueue("fine?", key="k2")
        wait_for(lambda: len(outbox.dead_letters()) == 2)
        recorder.close()
        assert recorder.stats == RecorderStats(queued=2, failed=2, retried=4)
        dead = outbox.dead_letters()
        assert [(d.key, d.attempts) for d in dead] == [("tk", 3), ("k2", 3)]
        assert dead[0].item == CapturedTurn("c1", "user", "keep me", 1, "tk")
        assert dead[0].error == "RuntimeError: attempt 3 refused"
        assert outbox.pending() == 0
        assert outbox.replay_dead_letters() == 2
        assert outbox.dead_letters() == []
        assert outbox.pending() == 2
    with SQLiteOutbox(path, retry=FAST) as outbox:
        sink = Flaky()
        with Recorder(sink, outbox=outbox):
            pass
        assert sink.items == [CapturedTurn("c1", "user", "keep me", 1, "tk"), "fine?"]
        assert outbox.pending() == 0


def test_a_running_recorder_replays_dead_letters_at_once(tmp_path: Path) -> None:
    with SQLiteOutbox(tmp_path / "o.db", retry=FAST) as outbox:
        healed = threading.Event()

        def sink(item: Any) -> None:
            if not healed.is_set():
                raise RuntimeError("down")

        with Recorder(sink, outbox=outbox) as recorder:
            recorder.enqueue("x", key="x")
            wait_for(lambda: len(outbox.dead_letters()) == 1)
            healed.set()
            assert recorder.replay_dead_letters() == 1
            wait_for(lambda: outbox.pending() == 0)
        assert recorder.stats.delivered == 1
    with pytest.raises(ConfigError):
        Recorder(sink).replay_dead_letters()


async def test_async_recorder_retries_and_dead_letters(tmp_path: Path) -> None:
    with SQLiteOutbox(tmp_path / "o.db", retry=FAST) as outbox:
        attempts: Counter[str | None] = Counter()

        async def sink(item: Any) -> None:
            attempts[current_key()] += 1
            if item == "never" or attempts[current_key()] < 2:
                raise RuntimeError("refused")

        async with AsyncRecorder(sink, outbox=outbox) as recorder:
            recorder.enqueue("once-failing", key="a")
            recorder.enqueue("never", key="b")
            while len(outbox.dead_letters()) < 1 or outbox.pending() > 0:
                await asyncio.sleep(0.01)
        assert attempts == Counter({"a": 2, "b": 3})
        assert recorder.stats == RecorderStats(queued=2, delivered=1, failed=1, retried=3)
        assert [d.key for d in outbox.dead_letters()] == ["b"]


def test_sqlite_errors_become_store_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="open"):
        SQLiteOutbox(tmp_path)  # a directory
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError):
        SQLiteOutbox(garbage)
    outbox = SQLiteOutbox(tmp_path / "o.db")
    outbox.close()
    recorder = Recorder(Flaky(), outbox=outbox)
    with pytest.raises(StoreError, match="load"):
        recorder.enqueue("x")  # auto-start reads leftovers from a closed outbox
    with pytest.raises(ConfigError):
        SQLiteOutbox(tmp_path / "p.db", synchronous="OFF")  # type: ignore[arg-type]


def test_a_failed_durable_write_keeps_the_hook_caller_from_advancing(tmp_path: Path) -> None:
    outbox = SQLiteOutbox(tmp_path / "o.db")
    recorder = Recorder(Flaky(), outbox=outbox)
    recorder.start()
    outbox.close()
    with pytest.raises(StoreError, match="put"):
        recorder.deliver(Demotion("c1", (DemotedMessage("user", "m", 0, "k0"),)))
    recorder.close()
    assert recorder.stats.queued == 0


def test_an_unreadable_row_is_dead_lettered_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    SQLiteOutbox(path).close()
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO outbox (key, payload, created_at) VALUES ('bad', '{', 0)")
    db.close()
    with SQLiteOutbox(path) as outbox:
        sink = Flaky()
        with Recorder(sink, outbox=outbox) as recorder:
            recorder.enqueue("ok", key="ok")
        assert sink.items == ["ok"]
        assert outbox.pending() == 0
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT key FROM dead_letters").fetchall() == [("bad",)]
        db.close()


@pytest.mark.parametrize("kill_after", [10, 120, 280])
def test_kill_9_mid_stream_loses_nothing(tmp_path: Path, kill_after: int) -> None:
    db = tmp_path / "outbox.db"
    delivered_log, enqueued_log = tmp_path / "delivered.log", tmp_path / "enqueued.log"
    args = ["kill", str(db), str(delivered_log), str(enqueued_log), "300"]
    child = subprocess.Popen([sys.executable, str(CHILD), *args])
    try:
        wait_for(lambda: len(lines(enqueued_log)) >= kill_after, timeout=30)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    enqueued = lines(enqueued_log)
    delivered_by_child = lines(delivered_log)
    assert len(set(delivered_by_child)) < 300  # the kill did interrupt the stream

    # The sink of the restarted process drops what the dead one already stored.
    stored = Counter(delivered_by_child)
    redelivered: list[str | None] = []

    def sink(item: Any) -> None:
        key = current_key()
        assert key is not None
        assert key == dedup_key(item, key)  # records carry their own key
        if key in stored:
            redelivered.append(key)
            return
        stored[key] += 1

    with SQLiteOutbox(db) as outbox:
        left = outbox.pending()
        assert left > 0
        with Recorder(sink, flush_timeout=30, outbox=outbox) as recorder:
            pass
        assert outbox.pending() == 0
        assert recorder.stats.delivered == left
    assert set(enqueued) <= set(stored)  # nothing that was enqueued was lost
    assert all(count == 1 for count in stored.values())  # and each is stored once
    assert len(redelivered) <= 1  # at most the item in flight at the kill


# -- checkpoints off the enqueue path ---------------------------------------------------


def _pages(path: Path) -> int:
    return path.stat().st_size // 4096 if path.exists() else 0


def _stalled_stream(outbox: SQLiteOutbox, count: int, pace: float = 0) -> None:
    """Enqueue ``count`` items while the sink sits on the first one (nothing is acked)."""
    release = threading.Event()
    recorder = Recorder(lambda item: release.wait(10), flush_timeout=0.01, outbox=outbox)
    try:
        for i in range(count):
            recorder.enqueue({"n": i, "text": "x" * 200}, key=f"k{i}")
            time.sleep(pace)
    finally:
        recorder.close()
        release.set()
        assert recorder._thread is not None
        recorder._thread.join(10)


def test_the_enqueue_path_never_checkpoints_a_background_thread_does(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    with SQLiteOutbox(path, checkpoint_every=8, wal_limit=100_000) as outbox:
        (auto,) = outbox._db.execute("PRAGMA wal_autocheckpoint").fetchone()
        assert auto == 0  # SQLite's automatic checkpoint would run inside enqueue
        empty = path.stat().st_size
        _stalled_stream(outbox, 300)
        # Only a checkpoint moves rows from the WAL into the database file.
        wait_for(lambda: path.stat().st_size > empty + 10 * 4096)
        stats = outbox.checkpoints
        assert stats.background >= 1
        assert (stats.restarts, stats.valve) == (0, 0)  # never in an enqueue, nor locked
        assert outbox.pending() == 299  # the sink finished one item after close


def test_a_stream_keeps_the_wal_bounded_and_every_item(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    with SQLiteOutbox(path, checkpoint_every=4, wal_limit=40) as outbox:
        _stalled_stream(outbox, 600, pace=0.001)  # ~1,400 WAL pages if it never started over
        assert outbox.checkpoints.background >= 1
        assert _pages(Path(f"{path}-wal")) < 700
    assert not Path(f"{path}-wal").exists()  # close checkpointed the rest
    with SQLiteOutbox(path) as outbox:
        assert outbox.pending() == 599  # every enqueued item survived the WAL's restarts


def test_a_wal_past_the_limit_is_copied_whole_so_it_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    with SQLiteOutbox(path, checkpoint_every=1000, wal_limit=1000) as outbox:
        for i in range(600):  # 1,200+ WAL pages; too few commits to wake the thread
            outbox.put(f"k{i}", '"v"')
        assert outbox.checkpoints == CheckpointStats()
        wal = Path(f"{path}-wal")
        size = wal.stat().st_size
        outbox._wake.set()  # what the next commit would do
        wait_for(lambda: outbox.checkpoints.restarts == 1)
        assert outbox.checkpoints.wal_pages >= 1000
        for i in range(100):
            outbox.put(f"again{i}", '"v"')
        assert wal.stat().st_size == size  # the WAL started over from its first page
        assert outbox.pending() == 700


class _NoCheckpointThread(SQLiteOutbox):
    """An outbox whose checkpoint thread has fallen behind for good."""

    def _background_checkpoint(self, db: sqlite3.Connection) -> None:
        pass


def test_the_valve_bounds_the_wal_when_the_checkpoint_thread_falls_behind(
    tmp_path: Path,
) -> None:
    path = tmp_path / "o.db"
    with _NoCheckpointThread(path, checkpoint_every=4, wal_limit=30) as outbox:
        _stalled_stream(outbox, 400)  # ~900 WAL pages if it never started over
        stats = outbox.checkpoints
        assert (stats.background, stats.restarts) == (0, 0)
        assert stats.valve >= 5  # about once per 2 * wal_limit commits
        # Two to three pages per commit: the valve fires by 60 commits after a restart.
        assert _pages(Path(f"{path}-wal")) < 250
        assert outbox.pending() == 399


def test_checkpoint_settings_are_checked_and_memory_needs_no_thread(tmp_path: Path) -> None:
    for every, limit in [(0, 10), (11, 10), (True, 10), (1, 2.5)]:
        with pytest.raises(ConfigError):
            SQLiteOutbox(tmp_path / "o.db", checkpoint_every=every, wal_limit=limit)  # type: ignore[arg-type]
    with SQLiteOutbox(":memory:", checkpoint_every=1, wal_limit=1) as outbox:
        assert outbox._checkpointer is None
        outbox.ack(outbox.put("k", '"v"'))
        assert outbox.pending() == 0
        assert outbox.checkpoints.background == 0


def test_an_outbox_dropped_unclosed_ends_its_checkpoint_thread(tmp_path: Path) -> None:
    outbox = SQLiteOutbox(tmp_path / "o.db")
    thread = outbox._checkpointer
    assert thread is not None and thread.is_alive()
    del outbox
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()
