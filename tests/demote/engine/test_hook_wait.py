"""No turn waits on a sink: ``hook_wait`` bounds a load, the call goes on in the background.

A slow (2 s) or hung sink, sync or async, from sync or async loads, one conversation or
sixteen threads: every load returns within a loose multiple of ``hook_wait``; the call
that outlived the wait keeps the conversation (no second call for it meanwhile), and its
success is committed, so once the sink is fast again every message has reached it exactly
once (counted in the sink). A call that fails in the background leaves its messages
pending with backoff; ``hook_timeout`` bounds only that background call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from demote import (
    Backoff,
    ConfigError,
    DemoteEvent,
    Demoter,
    Demotion,
    SlidingWindow,
    SQLiteArchive,
    SQLiteStateStore,
)
from demote.engine._flow import Deliver, Outcome, Running
from demote.state.memory import InMemoryStateStore
from tests.strategies import Msg, describer, unique

#: What a turn may take here, loosely: ``hook_wait`` is 0.25 s, the sink takes 2 s; a
#: busy shared machine may stall a thread a while, a waited-for sink would be 2 s or more.
BOUND = 1.5


class SlowSink:
    """Counts every message it accepts; each call takes ``delay`` s, or hangs until released."""

    def __init__(self, delay: float = 2.0) -> None:
        self.delay = delay
        self.hung = False
        self.release = threading.Event()
        self.fail = False
        self.lock = threading.Lock()
        self.keys: Counter[str] = Counter()
        self.indexes: dict[str, list[int]] = {}
        self.running: Counter[str] = Counter()
        self.max_running = 0

    def _enter(self, batch: Demotion) -> None:
        with self.lock:
            self.running[batch.conversation_id] += 1
            self.max_running = max(self.max_running, self.running[batch.conversation_id])

    def _leave(self, batch: Demotion) -> None:
        with self.lock:
            self.running[batch.conversation_id] -= 1
            if self.fail:
                raise RuntimeError("sink failed after a slow call")
            for m in batch.messages:
                self.keys[m.key] += 1
                self.indexes.setdefault(batch.conversation_id, []).append(m.index)

    def deliver(self, batch: Demotion) -> None:
        self._enter(batch)
        try:
            if self.hung:
                assert self.release.wait(30), "test sink hung for 30 s"
            elif self.delay:
                time.sleep(self.delay)
        finally:
            self._leave(batch)

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.keys.values())


class AsyncSlowSink(SlowSink):
    """The same sink as a native async hook (``adeliver`` only)."""

    deliver = None  # type: ignore[assignment]

    async def adeliver(self, batch: Demotion) -> None:
        self._enter(batch)
        try:
            if self.hung:
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
            elif self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self._leave(batch)


def _turn(i: int) -> list[Msg]:
    return unique([Msg("user", f"question {i}"), Msg("assistant", f"answer {i}")])


def _state(kind: str, tmp_path: Path) -> Any:
    return InMemoryStateStore() if kind == "memory" else SQLiteStateStore(tmp_path / "s.db")


def _exactly_once(sink: SlowSink, d: Demoter, cid: str, history: list[Msg]) -> None:
    """The sink is fast again: the next loads deliver what is left, each message once."""
    sink.delay, sink.hung = 0.0, False
    sink.release.set()
    assert d.drain(10), "the background call ended"
    w = d.load(cid, history, describer(d))
    assert w.pending == 0 and w.delivered == w.start
    assert sorted(sink.indexes.get(cid, [])) == list(range(w.start)), "lost or repeated"
    assert sink.duplicates() == 0


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("hung", [False, True], ids=["slow", "hung"])
def test_sync_loads_never_wait_on_a_slow_or_hung_sink(
    kind: str, hung: bool, tmp_path: Path
) -> None:
    sink = SlowSink(2.0)
    sink.hung = hung
    d = Demoter(SlidingWindow.last_messages(4), sink, state=_state(kind, tmp_path))
    history: list[Msg] = []
    slowest = 0.0
    began = time.monotonic()
    i = 0
    while time.monotonic() - began < 3.0 and i < 2000:  # past one 2 s call and into the next
        history += _turn(i)
        i += 1
        t0 = time.monotonic()
        w = d.load("c", history, describer(d))
        slowest = max(slowest, time.monotonic() - t0)
        assert len(w.messages) <= 4
        time.sleep(0.02)
    assert slowest < BOUND, f"a turn waited {slowest:.2f} s on the sink"
    assert sink.max_running == 1, "the conversation was not handed over twice at once"
    if not hung:  # the first call ended meanwhile and its watermark was committed
        assert len(sink.keys) > 0 and d.state_of("c").delivered > 0
    _exactly_once(sink, d, "c", history)


def test_a_late_success_is_committed_without_another_load(tmp_path: Path) -> None:
    sink = SlowSink(0.6)
    events: list[DemoteEvent] = []
    d = Demoter(SlidingWindow.last_messages(2), sink, state=SQLiteStateStore(tmp_path / "s.db"))
    d.observe(events.append)
    history = _turn(0) + _turn(1) + _turn(2)
    t0 = time.monotonic()
    w = d.load("c", history, describer(d))
    assert time.monotonic() - t0 < 0.55, "the load did not wait for the 0.6 s call"
    assert (w.start, w.pending, w.demoted) == (4, 4, 0)
    assert d.state_of("c").delivered == 0
    assert d.drain(10)
    state = d.state_of("c")
    assert (state.window_start, state.delivered) == (4, 4), "committed by the background call"
    assert d._delivery.gates == {}, "the gate was let go"
    w = d.load("c", history, describer(d))
    assert w.pending == 0 and sorted(sink.indexes["c"]) == [0, 1, 2, 3]
    assert sink.duplicates() == 0
    assert d._observers.wait_idle(5)
    assert [e.kind for e in events if e.kind == "delivered"] == ["delivered"]


def test_a_background_failure_leaves_the_messages_pending_with_backoff() -> None:
    sink = SlowSink(0.5)
    sink.fail = True
    events: list[DemoteEvent] = []
    d = Demoter(SlidingWindow.last_messages(2), sink, retry=Backoff(0.2, 0.2))
    d.observe(events.append)
    history = _turn(0) + _turn(1)
    assert d.load("c", history, describer(d)).pending == 2
    deadline = time.monotonic() + 10
    while d.conversation_stats("c").failures == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # the call goes on in the background, and fails there
    assert d.state_of("c").delivered == 0, "nothing committed for a failed call"
    assert d.conversation_stats("c").failures == 1
    assert d._observers.wait_idle(5)
    assert [e.kind for e in events if e.kind.startswith("deliver")] == ["delivery_failed"]
    sink.fail, sink.delay = False, 0.0
    assert d.drain(10), "no next load needed: drain delivers what is pending"
    assert d.state_of("c").delivered == 2 and d.conversation_stats("c").pending == 0
    assert sink.duplicates() == 0 and len(sink.keys) == 2


def test_hook_timeout_bounds_only_the_background_call() -> None:
    sink = SlowSink()
    sink.hung = True
    events: list[DemoteEvent] = []
    d = Demoter(SlidingWindow.last_messages(2), sink, hook_wait=0.05, hook_timeout=0.4)
    d.observe(events.append)
    history = _turn(0) + _turn(1)
    t0 = time.monotonic()
    w = d.load("c", history, describer(d))
    assert time.monotonic() - t0 < 0.35, "the load waited hook_wait, not hook_timeout"
    assert w.events == () or all(e.kind != "delivery_failed" for e in w.events)
    deadline = time.monotonic() + 10
    while d.conversation_stats("c").failures == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "HookTimeout" in (d.conversation_stats("c").last_error or "")
    assert d._delivery.gates, "the call still runs: the conversation stays busy"
    _exactly_once(sink, d, "c", history)  # its late success still counts
    assert len(sink.keys) == 2


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_call_outliving_its_loads_event_loop_still_counts_once(kind: str, tmp_path: Path) -> None:
    """``asyncio.run`` closes the loop of the load whose sync call outlived ``hook_wait``.

    The call runs on in its hook thread: it keeps the conversation until it ends (a load
    on the next loop hands nothing over again) and its success is committed, followed on a
    thread once its loop is gone (``drain`` waits for it).
    """
    sink = SlowSink(0.6)
    d = Demoter(SlidingWindow.last_messages(2), sink, state=_state(kind, tmp_path))
    history = _turn(0) + _turn(1) + _turn(2)
    w = asyncio.run(d.aload("c", history, describer(d)))
    assert (w.start, w.pending, w.demoted) == (4, 4, 0), "the load did not wait for the call"
    asyncio.run(d.aload("c", history, describer(d)))  # a new loop, the call still running
    assert d.drain(10), "the call is followed to its end after its loop closed"
    state = d.state_of("c")
    assert (state.window_start, state.delivered) == (4, 4), "its late success was committed"
    assert d._delivery.gates == {}, "the gate was let go"
    assert sink.max_running == 1, "the conversation was not handed over twice at once"
    _exactly_once(sink, d, "c", history)


@pytest.mark.parametrize("sink_type", [SlowSink, AsyncSlowSink], ids=["sync-sink", "async-sink"])
@pytest.mark.parametrize("hung", [False, True], ids=["slow", "hung"])
async def test_async_loads_never_wait_on_a_slow_or_hung_sink(
    sink_type: type[SlowSink], hung: bool, tmp_path: Path
) -> None:
    sink = sink_type(2.0)
    sink.hung = hung
    d = Demoter(SlidingWindow.last_messages(4), sink, state=SQLiteStateStore(tmp_path / "s.db"))
    history: list[Msg] = []
    slowest = 0.0
    began = time.monotonic()
    i = 0
    while time.monotonic() - began < 3.0 and i < 2000:
        history += _turn(i)
        i += 1
        t0 = time.monotonic()
        w = await d.aload("c", history, describer(d))
        slowest = max(slowest, time.monotonic() - t0)
        assert len(w.messages) <= 4
        await asyncio.sleep(0.02)
    assert slowest < BOUND, f"a turn waited {slowest:.2f} s on the sink"
    assert sink.max_running == 1
    sink.delay, sink.hung = 0.0, False
    sink.release.set()
    assert await d.adrain(10)
    w = await d.aload("c", history, describer(d))
    assert w.pending == 0 and w.delivered == w.start
    assert sorted(sink.indexes["c"]) == list(range(w.start)), "lost or repeated"
    assert sink.duplicates() == 0


def test_sixteen_threads_on_a_slow_sink(tmp_path: Path) -> None:
    sink = SlowSink(2.0)
    d = Demoter(
        SlidingWindow.last_messages(4),
        sink,
        state=SQLiteStateStore(tmp_path / "s.db"),
        retry=Backoff(0.05, 0.2),
    )
    histories: dict[str, list[Msg]] = {f"c{n}": [] for n in range(16)}
    slowest: list[float] = []
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        cid = f"c{n}"
        mine = 0.0
        try:
            began = time.monotonic()
            i = 0
            while time.monotonic() - began < 3.0 and i < 500:
                histories[cid] += _turn(i)
                i += 1
                t0 = time.monotonic()
                w = d.load(cid, histories[cid], describer(d))
                mine = max(mine, time.monotonic() - t0)
                assert len(w.messages) <= 4
                time.sleep(0.02)
        except BaseException as exc:
            errors.append(exc)
        slowest.append(mine)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(slowest) == 16 and max(slowest) < BOUND * 2, f"slowest turn {max(slowest):.2f} s"
    assert sink.max_running == 1, "no conversation was handed over twice at once"
    sink.delay = 0.0
    assert d.drain(10)
    time.sleep(0.25)  # past any backoff (HookBusy refusals when all hook threads were busy)
    for cid, history in histories.items():
        w = d.load(cid, history, describer(d))
        assert w.pending == 0, cid
        assert sorted(sink.indexes.get(cid, [])) == list(range(w.start)), cid
    assert sink.duplicates() == 0


def test_the_sqlite_archive_still_looks_synchronous(tmp_path: Path) -> None:
    archive = SQLiteArchive(tmp_path / "a.db")
    d = Demoter(SlidingWindow.last_messages(2), archive)
    w = d.load("c", _turn(0) + _turn(1), describer(d))
    assert (w.pending, w.demoted) == (0, 2)
    assert archive.count("c") == 2, "readable right after the turn"


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "1", True])
def test_hook_wait_is_validated(value: object) -> None:
    with pytest.raises(ConfigError, match="hook_wait"):
        Demoter(SlidingWindow.last_messages(2), hook_wait=value)  # type: ignore[arg-type]


def test_hook_wait_none_waits_up_to_hook_timeout() -> None:
    sink = SlowSink(0.3)
    d = Demoter(SlidingWindow.last_messages(2), sink, hook_wait=None)
    assert d.hook_wait is None
    t0 = time.monotonic()
    w = d.load("c", _turn(0) + _turn(1), describer(d))
    assert time.monotonic() - t0 >= 0.3 and (w.pending, w.demoted) == (0, 2)


# -- a call that ends just as the wait for it runs out ---------------------------------------


class _EndsAsTheWaitRunsOut(Future[None]):
    """A hook thread's future whose call ends (well, or with ``error``) just as a bounded
    wait for it gives up: the wait raises ``TimeoutError`` though the call is done.

    A stand-in for a race no real timing reproduces at will (CI met it under load: the
    load reported the wait's ``TimeoutError`` as the hook's own failure).
    """

    def __init__(self, error: BaseException | None = None) -> None:
        super().__init__()
        self.error = error

    def result(self, timeout: float | None = None) -> None:
        if timeout is not None and not self.done():
            if self.error is None:
                self.set_result(None)
            else:
                self.set_exception(self.error)
            raise TimeoutError
        return super().result(timeout)


class _Runner:
    """Hands out one prepared future instead of running the call (the race above)."""

    size = 1

    def __init__(self, future: Future[None]) -> None:
        self.future = future

    def submit(self, fn: Any, *args: Any) -> Future[None]:
        return self.future

    def withdraw(self, future: Future[None]) -> bool:
        return False


@pytest.mark.parametrize(
    ("error", "raised"),
    [(None, None), (RuntimeError("sink down"), RuntimeError), (TimeoutError(), TimeoutError)],
)
def test_a_call_that_ends_as_the_wait_runs_out_counts_its_own_outcome(
    error: BaseException | None, raised: type[BaseException] | None
) -> None:
    """Its success is a success, its own error (a ``TimeoutError`` too) is its error."""
    batch = Demotion("c", ())
    runner = _Runner(_EndsAsTheWaitRunsOut(error))
    deliver = Deliver(object(), batch, 0.25, 30.0, runner, print)  # type: ignore[arg-type]
    late = Running(_EndsAsTheWaitRunsOut(error), None, False)
    follow = Outcome(late, time.monotonic() + 0.01)
    for step in (deliver.run_sync, follow.run_sync):
        if raised is None:
            assert step() in (None, True)
        else:
            with pytest.raises(raised):
                step()
