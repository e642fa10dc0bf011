"""Erase in the capture layer: the dispatcher, the SQLite outbox (bytes, upgrade, fences),
and both Recorders (queued items, the item in flight, the sink as the next tier)."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from demote.capture import AsyncRecorder, Recorder, RecorderStats, RetryPolicy, SQLiteOutbox
from demote.capture.codec import decode, encode
from demote.capture.dispatch import Deliver, Dispatcher, Envelope, Verdict, Wait
from demote.erase import tiers
from demote.errors import FencedOut, HookTimeout, StoreError
from demote.records import CapturedTurn, DemotedMessage, Demotion

SLOW = RetryPolicy(max_attempts=3, base_delay=30, max_delay=30)  # no retry during a test


def batch(cid: str, text: str, fence: int | None = None, n: int = 1) -> Demotion:
    messages = tuple(
        DemotedMessage("user", f"{text} #{i}", i, f"{cid}-{text}-{i}") for i in range(n)
    )
    return Demotion(cid, messages, fence)


def leaks(db: Path, secret: str) -> list[str]:
    """The outbox's files (main, WAL, shared memory) whose raw bytes contain ``secret``."""
    needle = secret.encode()
    files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    return [f.name for f in files if f.exists() and needle in f.read_bytes()]


def wait_for(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class Shelf:
    """A sink that keeps items by conversation and erases them; optionally gated or failing."""

    def __init__(self, *, gate: bool = False, fail: int = 0) -> None:
        self.items: list[Any] = []
        self.gate = threading.Event()
        if not gate:
            self.gate.set()
        self.entered = threading.Event()
        self.fail = fail
        self.calls = 0

    def deliver(self, item: Any) -> None:
        self.calls += 1
        self.entered.set()
        assert self.gate.wait(10)
        if self.fail:
            self.fail -= 1
            raise RuntimeError("sink refuses")
        self.items.append(item)

    def erase(self, conversation_id: str, **_: Any) -> int:
        mine = self.of(conversation_id)
        self.items = [i for i in self.items if i not in mine]
        return len(mine)

    def of(self, cid: str) -> list[Any]:
        return [i for i in self.items if getattr(i, "conversation_id", None) == cid]


# -- the dispatcher (sans-I/O) ----------------------------------------------------------


def test_dispatcher_erase_takes_out_waiting_items_and_retries_of_that_conversation() -> None:
    d = Dispatcher(RetryPolicy(max_attempts=3, base_delay=10, max_delay=10))
    a1, b1, a2, plain = (
        Envelope("a1", "A1", conversation="a"),
        Envelope("b1", "B1", conversation="b"),
        Envelope("a2", "A2", conversation="a"),
        Envelope("p", {"x": 1}),
    )
    for envelope in (a1, b1, a2, plain):
        d.accepted()
        d.receive(envelope)
    assert d.next_step(0) == Deliver(a1)
    retry = d.settle(a1, RuntimeError("x"), now=0)  # a1 waits for its backoff
    assert retry.verdict is Verdict.RETRY
    assert d.erase("a") == 2  # a1's retry and a2
    assert d.next_step(1) == Deliver(b1)
    d.settle(b1, None, now=1)
    assert d.next_step(2) == Deliver(plain)  # a plain value belongs to no conversation
    d.settle(plain, None, now=2)
    assert d.next_step(20) == Wait(None), "a1's retry is gone"
    assert d.stats == RecorderStats(queued=4, delivered=2, retried=1, erased=2)
    assert d.unfinished == 0


@pytest.mark.parametrize("fails", [True, False])
def test_dispatcher_erase_of_the_item_in_flight(fails: bool) -> None:
    d = Dispatcher(RetryPolicy(max_attempts=3, base_delay=0, max_delay=0))
    a = Envelope("a", "A", conversation="a")
    d.accepted()
    d.receive(a)
    assert d.next_step(0) == Deliver(a)
    assert d.delivering("a") and not d.delivering("b")
    assert d.erase("a") == 0  # in the sink: it cannot be taken back...
    decision = d.settle(a, RuntimeError("x") if fails else None, now=0)
    assert not d.delivering("a")
    if fails:  # ...but it is not retried
        assert decision.verdict is Verdict.ERASED
        assert d.next_step(1) == Wait(None)
        assert d.stats == RecorderStats(queued=1, erased=1)
    else:  # it reached the sink, whose own erase comes next
        assert decision.verdict is Verdict.ACK
        assert d.stats == RecorderStats(queued=1, delivered=1)
    assert d.unfinished == 0


# -- codec -----------------------------------------------------------------------------


def test_a_batch_keeps_its_fence_through_the_outbox() -> None:
    fenced = batch("c", "hello", fence=42)
    assert decode(encode(fenced)).fence == 42
    assert decode(encode(batch("c", "hello"))).fence is None
    bad = encode(fenced).replace('"fence":42', '"fence":"42"')
    with pytest.raises(StoreError, match="fence"):
        decode(bad)


# -- the outbox ----------------------------------------------------------------------------


def fill(outbox: SQLiteOutbox, item: Any, key: str) -> int:
    cid = item.conversation_id if isinstance(item, Demotion | CapturedTurn) else None
    return outbox.put(key, encode(item), conversation=cid)


def test_outbox_erase_deletes_queued_and_dead_letters_of_one_conversation(
    tmp_path: Path,
) -> None:
    with SQLiteOutbox(tmp_path / "o.db", retry=SLOW) as outbox:
        fill(outbox, batch("c", "queued"), "k1")
        dead = fill(outbox, CapturedTurn("c", "user", "dead turn", 3, "t1"), "k2")
        outbox.bury(dead, 3, "RuntimeError: no")
        fill(outbox, batch("other", "stays"), "k3")
        other_dead = fill(outbox, batch("other", "stays dead"), "k4")
        outbox.bury(other_dead, 3, "RuntimeError: no")
        fill(outbox, {"plain": "value"}, "k5")
        assert outbox.erase("c") == 2
        assert [r.key for r in outbox.load()] == ["k3", "k5"]
        assert [d.key for d in outbox.dead_letters()] == ["k4"]
        assert outbox.erase("c") == 0
        assert outbox.replay_dead_letters() == 1  # revived rows keep their conversation
        assert outbox.erase("other") == 2
        assert [r.key for r in outbox.load()] == ["k5"]


def test_erased_text_survives_in_no_outbox_file(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    secret, kept = "locker-4417-zq9", "bicycle-2208-xk4"
    with SQLiteOutbox(db, retry=SLOW, checkpoint_every=8, wal_limit=64) as outbox:
        for i in range(300):  # traffic: acked rows, checkpoints, big rows on overflow pages
            for cid, word in (("c", secret), ("o", kept)):
                row = fill(outbox, batch(cid, f"{word} {i} " + "x" * (i * 40)), f"{cid}{i}")
                if i % 3:
                    outbox.ack(row)
        outbox.bury(fill(outbox, batch("c", secret), "dead"), 3, "no")
        assert leaks(db, secret), "the reading method sees the text before the erase"
        assert outbox.erase("c") == 101
        assert leaks(db, secret) == []
        assert leaks(db, kept) and len(outbox.load()) == 100
    assert leaks(db, secret) == []


def test_the_fence_table_holds_a_hash_and_refuses_older_batches(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    cid = "tenant-7f3a@example.org"
    with SQLiteOutbox(db) as outbox:
        fill(outbox, batch(cid, "text"), "k0")
        assert outbox.erase(cid, fence=7) == 1
        payload = encode(batch(cid, "late"))
        with pytest.raises(FencedOut, match="fencing token 6"):
            outbox.put("k1", payload, conversation=cid, fence=6)
        assert outbox.pending() == 0, "nothing stored"
        outbox.put("k2", payload, conversation=cid, fence=8)  # a later lease
        outbox.put("k3", payload, conversation=cid)  # no lease: nothing to compare
        outbox.put("k4", encode(batch("other", "x")), conversation="other", fence=1)
        outbox.erase(cid, fence=3)  # an older erase never lowers the fence
        with pytest.raises(FencedOut):
            outbox.put("k5", payload, conversation=cid, fence=6)
        rows = sqlite3.connect(db).execute("SELECT conversation, fence FROM erased").fetchall()
    digest = hashlib.blake2b(cid.encode(), digest_size=16).hexdigest()
    assert rows == [(digest, 7)]
    assert leaks(db, cid) == [], "no row, fence or index names the erased conversation"


def test_an_outbox_file_from_before_erase_is_upgraded(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    old = sqlite3.connect(db)
    old.executescript(
        """
        CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,
            payload TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT,
            created_at REAL NOT NULL);
        CREATE TABLE dead_letters (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,
            payload TEXT NOT NULL, attempts INTEGER NOT NULL, error TEXT,
            created_at REAL NOT NULL, failed_at REAL NOT NULL);
        """
    )
    rows = [
        ("k1", encode(batch("c", 'it mentions "conversation_id": "other"'))),
        ("k2", encode(CapturedTurn("other", "user", "hi c", 1, "t"))),
        ("k3", encode({"conversation_id": "c"})),  # a plain value: no conversation
        ("k4", "{corrupt"),
    ]
    old.executemany("INSERT INTO outbox (key, payload, created_at) VALUES (?, ?, 0)", rows)
    old.execute(
        "INSERT INTO dead_letters (key, payload, attempts, created_at, failed_at)"
        " VALUES ('k5', ?, 3, 0, 0)",
        (encode(batch("c", "dead")),),
    )
    old.commit()
    old.close()
    with SQLiteOutbox(db) as outbox:
        assert outbox.erase("c") == 2  # k1 and the dead letter k5
        assert [r.key for r in outbox.load()] == ["k2", "k3", "k4"]
        assert outbox.erase("other") == 1
    with SQLiteOutbox(db) as outbox:  # opening an upgraded file again changes nothing
        assert [r.key for r in outbox.load()] == ["k3", "k4"]


# -- the Recorders -----------------------------------------------------------------------


@pytest.mark.parametrize("durable", [False, True])
def test_recorder_erase_drops_queued_items_so_none_reaches_the_sink(
    tmp_path: Path, durable: bool
) -> None:
    outbox = SQLiteOutbox(tmp_path / "o.db", retry=SLOW) if durable else None
    sink = Shelf(gate=True)
    recorder = Recorder(sink, outbox=outbox)
    recorder.enqueue(batch("o", "first"))  # the worker blocks in the sink on this one
    assert sink.entered.wait(5)
    for i in range(3):
        recorder.enqueue(batch("c", f"secret {i}"))
        recorder.enqueue(batch("o", f"kept {i}"))
    recorder.enqueue({"plain": 1}, key="p")
    assert recorder.erase("c") == 3
    sink.gate.set()
    recorder.close()
    assert sink.of("c") == [] and len(sink.of("o")) == 4
    assert recorder.stats.erased == 3 and recorder.stats.delivered == 5
    if outbox is not None:
        assert outbox.pending() == 0
        outbox.close()


def test_recorder_erase_waits_for_the_conversation_item_in_the_sink(tmp_path: Path) -> None:
    with SQLiteOutbox(tmp_path / "o.db", retry=SLOW) as outbox:
        sink = Shelf(gate=True)
        recorder = Recorder(sink, outbox=outbox)
        recorder.enqueue(batch("c", "in flight"))
        recorder.enqueue(batch("c", "queued"))
        assert sink.entered.wait(5)
        threading.Timer(0.3, sink.gate.set).start()
        began = time.monotonic()
        assert recorder.erase("c") == 2  # both rows left the outbox
        assert time.monotonic() - began >= 0.2, "it waited for the item in the sink"
        assert [i.messages[0].text for i in sink.of("c")] == ["in flight #0"]
        # The sink is the next tier: erasing it now leaves nothing behind.
        assert [label for label, _ in tiers(recorder)] == ["Recorder", "Recorder[0].Shelf"]
        assert recorder.parts() == (sink,)
        assert sink.erase("c") == 1
        recorder.close()
        assert sink.items == [] and outbox.pending() == 0


def test_an_erased_item_that_fails_in_the_sink_is_not_retried(tmp_path: Path) -> None:
    fast = RetryPolicy(max_attempts=5, base_delay=0.01, max_delay=0.01)
    with SQLiteOutbox(tmp_path / "o.db", retry=fast) as outbox:
        sink = Shelf(gate=True, fail=1)
        recorder = Recorder(sink, outbox=outbox)
        recorder.enqueue(batch("c", "fails once"))
        assert sink.entered.wait(5)
        threading.Timer(0.2, sink.gate.set).start()
        recorder.erase("c")
        recorder.enqueue(batch("o", "later"))
        recorder.close()
        assert sink.calls == 2 and sink.of("c") == [], "tried once, not retried"
        assert recorder.stats == RecorderStats(queued=2, delivered=1, erased=1)
        assert outbox.pending() == 0 and outbox.dead_letters() == []


def test_erase_gives_up_on_a_hung_sink_with_a_timeout(tmp_path: Path) -> None:
    with SQLiteOutbox(tmp_path / "o.db", retry=SLOW) as outbox:
        sink = Shelf(gate=True, fail=1)
        recorder = Recorder(sink, flush_timeout=0.1, outbox=outbox)
        recorder.enqueue(batch("c", "stuck"))
        assert sink.entered.wait(5)
        with pytest.raises(HookTimeout, match="still being delivered"):
            recorder.erase("c")
        assert outbox.pending() == 0, "its row is gone all the same"
        sink.gate.set()  # it fails in the end: not retried, not dead-lettered
        wait_for(lambda: recorder.stats.erased == 1)
        recorder.close()
        assert sink.calls == 1 and outbox.dead_letters() == []


def test_the_outbox_refuses_a_batch_older_than_the_erase(tmp_path: Path) -> None:
    with SQLiteOutbox(tmp_path / "o.db") as outbox:
        sink = Shelf()
        with Recorder(sink, outbox=outbox) as recorder:
            recorder.enqueue(batch("c", "before", fence=4))
            wait_for(lambda: sink.items)
            recorder.erase("c", fence=5)
            with pytest.raises(FencedOut):
                recorder.enqueue(batch("c", "late write", fence=4))
            recorder.enqueue(batch("c", "new lease", fence=6))
        assert [i.messages[0].text for i in sink.items] == ["before #0", "new lease #0"]
        assert recorder.stats.queued == 2


async def test_async_recorder_aerase(tmp_path: Path) -> None:
    release = asyncio.Event()
    entered = asyncio.Event()
    got: list[Demotion] = []

    async def sink(item: Demotion) -> None:
        entered.set()
        await release.wait()
        got.append(item)

    with SQLiteOutbox(tmp_path / "o.db", retry=SLOW) as outbox:
        async with AsyncRecorder(sink, outbox=outbox) as recorder:
            recorder.enqueue(batch("c", "in flight"))
            recorder.enqueue(batch("c", "queued"))
            recorder.enqueue(batch("o", "kept"))
            await entered.wait()
            asyncio.get_running_loop().call_later(0.2, release.set)
            assert await recorder.aerase("c") == 2
            assert got and got[0].messages[0].text == "in flight #0", "it ended first"
        assert [b.conversation_id for b in got] == ["c", "o"]
        assert recorder.stats.erased == 1 and outbox.pending() == 0
