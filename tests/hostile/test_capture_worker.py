"""The catalogue, capture's worker: whatever a sink or an outbox file does, it lives on.

A sink that raises anything (a BaseException, an error whose ``str`` raises, megabytes of
message, a lone surrogate) or returns garbage, a corrupt outbox row, a policy at its
bounds: the worker delivers the next item, nothing is stuck, ``dead_letters()`` reads.
An outbox locked by another writer fails ``enqueue`` within its ``timeout``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from demote import Demoter, SlidingWindow, SQLiteArchive
from demote.capture import AsyncRecorder, Recorder, RetryPolicy, SQLiteOutbox
from demote.errors import HookBusy, StoreError
from demote.records import storable_text
from tests.hostile.harness import wait_for
from tests.strategies import Msg

FAST = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.01)


class Weird(BaseException):
    """Not an Exception: what a careless sink may still raise."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


async def _coro() -> None:
    return None


def _raise(exc: BaseException) -> Callable[[Any], object]:
    def sink(item: Any) -> object:
        raise exc

    return sink


#: Sinks that misbehave on the item "bad"; each must leave the worker alive.
BAD_SINKS: dict[str, Callable[[Any], object]] = {
    "BaseException": _raise(Weird("boom")),
    "SystemExit": _raise(SystemExit(3)),
    "GeneratorExit": _raise(GeneratorExit()),
    "unprintable error": _raise(Unprintable()),
    "lone surrogate error": _raise(ValueError("bad \ud800 text")),
    "10 MB error": _raise(ValueError("x" * 10_000_000)),
    "returns a coroutine": lambda item: _coro(),
    "returns garbage": lambda item: object(),
}


def _sink(misbehave: Callable[[Any], object], got: list[Any]) -> Callable[[Any], object]:
    def sink(item: Any) -> object:
        if item == "bad":
            return misbehave(item)
        got.append(item)
        return None

    return sink


@pytest.mark.parametrize("name", list(BAD_SINKS))
@pytest.mark.parametrize("durable", [False, True], ids=["memory", "outbox"])
def test_a_bad_sink_never_kills_the_thread_worker(name: str, durable: bool, tmp_path: Path) -> None:
    got: list[Any] = []
    box = SQLiteOutbox(tmp_path / "o.db", retry=FAST) if durable else None
    r = Recorder(_sink(BAD_SINKS[name], got), flush_timeout=5, outbox=box)
    r.enqueue("bad")
    r.enqueue("good")
    assert wait_for(lambda: got == ["good"]), f"the worker died on a sink that {name}"
    if box is not None:
        # "bad" may still wait for its retry after "good" went through: the live worker
        # must finish it (dead letter) before close, which leaves scheduled retries queued.
        assert wait_for(lambda: box.pending() == 0)
    r.close()
    if box is not None:
        letters = box.dead_letters()
        returns = name.startswith("returns")
        assert len(letters) == (0 if returns else 1)
        assert all(len(d.error or "") <= 2_000 for d in letters)
        box.close()


# SystemExit is left out: asyncio propagates it from a task by design (a sink raising it
# asks the process to exit), as it does KeyboardInterrupt and cancellation.
@pytest.mark.parametrize("name", [n for n in BAD_SINKS if n != "SystemExit"])
def test_a_bad_sink_never_kills_the_async_worker(name: str, tmp_path: Path) -> None:
    got: list[Any] = []
    misbehave = BAD_SINKS[name]

    async def sink(item: Any) -> object:
        if item == "bad":
            result = misbehave(item)
            if asyncio.iscoroutine(result):
                return await result
            return result
        got.append(item)
        return None

    async def main() -> None:
        box = SQLiteOutbox(tmp_path / "o.db", retry=FAST)
        async with AsyncRecorder(sink, flush_timeout=5, outbox=box) as r:
            r.enqueue("bad")
            r.enqueue("good")
            for _ in range(500):
                if got and box.pending() == 0:
                    break
                await asyncio.sleep(0.01)
        assert got == ["good"] and box.pending() == 0
        box.close()

    asyncio.run(main())


def _corrupt(path: Path, rows: list[tuple[Any, Any, Any]]) -> None:
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO outbox (key, payload, attempts, created_at) VALUES (?, ?, ?, 0)", rows
    )
    db.commit()
    db.close()


CORRUPT_ROWS = {
    "not JSON": ("k1", "{not json", 0),
    "wrong kind": ("k2", '{"kind":"moon","v":1}', 0),
    "wrong version": ("k3", '{"kind":"json","value":1,"v":99}', 0),
    "attempts text": ("k4", '{"kind":"json","value":1,"v":1}', "many"),
    "attempts float": ("k5", '{"kind":"json","value":1,"v":1}', 1.5),
    "messages an int": ("k8", '{"kind":"demotion","v":1,"conversation_id":"c","messages":5}', 0),
    "payload blob": ("k6", b'{"kind":"json","value":1,"v":1}', 0),
    "turn missing text": ("k7", '{"kind":"turn","v":1,"conversation_id":"c"}', 0),
}


@pytest.mark.parametrize("name", list(CORRUPT_ROWS))
def test_a_corrupt_row_is_dead_lettered_and_never_crashes_the_worker(
    name: str, tmp_path: Path
) -> None:
    path = tmp_path / "o.db"
    SQLiteOutbox(path).close()
    _corrupt(path, [CORRUPT_ROWS[name]])
    got: list[Any] = []
    box = SQLiteOutbox(path, retry=FAST)
    r = Recorder(got.append, flush_timeout=5, outbox=box)
    r.enqueue({"fresh": True})
    assert wait_for(lambda: got == [{"fresh": True}] and box.pending() == 0)
    r.close()
    letters = box.dead_letters()  # must keep working after the corrupt row moved here
    assert len(letters) == 1 and letters[0].error
    assert (letters[0].item is None) == name.startswith(("not", "wrong", "payload", "m", "turn"))
    assert box.replay_dead_letters() == 1
    box.close()


def test_an_enqueue_on_a_locked_outbox_fails_within_its_timeout(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    box = SQLiteOutbox(path, timeout=0.2)
    r = Recorder(lambda item: None, outbox=box)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    try:
        began = time.monotonic()
        with pytest.raises(StoreError, match="timeout"):
            r.enqueue({"a": 1})
        assert time.monotonic() - began < 5
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert box.pending() == 0  # nothing was queued: the caller keeps its watermark
    r.enqueue({"a": 2})
    assert wait_for(lambda: box.pending() == 0)
    r.close()
    box.close()


def test_the_default_outbox_timeout_is_short() -> None:
    assert SQLiteOutbox(":memory:").timeout <= 5


def test_a_huge_attempt_count_retries_without_hanging(tmp_path: Path) -> None:
    policy = RetryPolicy(max_attempts=2**31 - 1, base_delay=0.0, max_delay=0.0)
    began = time.monotonic()
    assert policy.delay(2**31 - 2) == 0.0
    assert time.monotonic() - began < 1


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "outbox"])
def test_a_stalled_sink_bounds_the_queue(durable: bool, tmp_path: Path) -> None:
    release = threading.Event()
    got: list[Any] = []

    def sink(item: Any) -> None:
        release.wait(10)
        got.append(item)

    box = SQLiteOutbox(tmp_path / "o.db") if durable else None
    r = Recorder(sink, flush_timeout=5, outbox=box, max_queued=3)
    for i in range(3):
        r.enqueue({"i": i})
    with pytest.raises(HookBusy, match="max_queued"):
        r.enqueue({"i": 3})
    if box is not None:
        assert box.pending() == 3  # the refused item wrote nothing
    release.set()
    assert wait_for(lambda: len(got) == 3)
    r.enqueue({"i": 4})  # room again
    assert wait_for(lambda: len(got) == 4)
    r.close()
    assert [g["i"] for g in got] == [0, 1, 2, 4]
    if box is not None:
        assert box.pending() == 0
        box.close()


def test_a_lone_surrogate_never_blocks_a_conversation_behind_a_durable_recorder(
    tmp_path: Path,
) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    box = SQLiteOutbox(tmp_path / "o.db")
    r = Recorder(archive, flush_timeout=5, outbox=box)
    d = Demoter(SlidingWindow.last_messages(2), r)
    texts = ["lone \ud800 surrogate", "ok", "q", "a"]
    history = [Msg(("user", "assistant")[i % 2], t) for i, t in enumerate(texts)]
    w = d.load("c", history, lambda m: d.describe(m.role, m.text))
    assert (w.start, w.pending, w.delivered) == (2, 0, 2)  # queued: the watermark moved on
    assert wait_for(lambda: archive.count("c") == 2 and box.pending() == 0)
    assert archive.messages("c")[0].text == storable_text(texts[0])
    d.close()
    r.close()
    box.close()
    archive.close()
