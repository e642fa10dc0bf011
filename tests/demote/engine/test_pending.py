"""Pending deliveries reach the hook without a next load.

A busy hook queues calls instead of refusing them (``hook_queue``), and withdraws one
that could not start within ``hook_timeout``; a conversation left with pending messages
is loaded again in the background until they are delivered, bounded and counted in
``stats()``; ``drain(timeout)`` delivers what is pending at once. Throughout, each
message reaches the hook once in a process, and a second worker sharing the state store
is fenced as before. The 16-thread, 1,000-conversation LlamaIndex run is in
tests/llamaindex_demote/test_llamaindex_pending.py.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from demote import (
    Backoff,
    ConfigError,
    Demoter,
    Demotion,
    HookBusy,
    InMemoryStateStore,
    SlidingWindow,
)
from tests.strategies import Msg, describer, unique

LAST2 = SlidingWindow.last_messages(2)


class Sink:
    """Counts what it accepts; fails ``fail`` more calls; each call may block on ``gate``."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.lock = threading.Lock()
        self.keys: Counter[str] = Counter()
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()
        self.loops: list[asyncio.AbstractEventLoop | None] = []

    def deliver(self, batch: Demotion) -> None:
        assert self.gate.wait(30), "test sink held for 30 s"
        with self.lock:
            self.calls += 1
            if self.fail:
                self.fail -= 1
                raise RuntimeError("sink down")
            self.keys.update(m.key for m in batch.messages)

    def twice(self) -> list[str]:
        return [k for k, n in self.keys.items() if n > 1]


def chat(n: int, tag: str = "") -> list[Msg]:
    return unique([Msg(("user", "assistant")[i % 2], f"m{i}") for i in range(n)], tag)


def until(check: Callable[[], bool], seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- a busy hook queues -----------------------------------------------------------------------


def test_a_busy_hook_queues_calls_instead_of_refusing_them() -> None:
    sink = Sink()
    sink.gate.clear()  # the one hook thread is busy until the gate opens
    d = Demoter(LAST2, sink, hook_threads=1, hook_queue=4, hook_wait=0.05)
    windows = [d.load(f"c{n}", chat(6, f"c{n}"), describer(d)) for n in range(3)]
    assert [w.pending for w in windows] == [4, 4, 4], "each call outlived its load's wait"
    assert d.stats().queued == 2, "one runs, two wait for the thread: none refused"
    sink.gate.set()
    assert until(lambda: d.stats().pending == 0 and not d._delivery.gates)
    assert d.stats().failures == 0 and len(sink.keys) == 12 and sink.twice() == []


def test_a_queued_call_that_cannot_start_within_hook_timeout_is_withdrawn() -> None:
    sink = Sink()
    sink.gate.clear()  # hung
    d = Demoter(LAST2, sink, hook_threads=1, hook_queue=1, hook_timeout=0.2, hook_wait=0.05)
    d.load("hung", chat(6, "h"), describer(d))  # holds the thread
    d.load("queued", chat(6, "q"), describer(d))  # waits for it
    w = d.load("refused", chat(6, "r"), describer(d))  # the queue is full
    assert w.pending == 4 and "HookBusy" in (d.conversation_stats("refused").last_error or "")
    assert until(lambda: "withdrawn" in (d.conversation_stats("queued").last_error or ""), 5)
    assert d.stats().queued == 0, "the withdrawn call left the queue"
    sink.gate.set()
    assert d.drain(10)
    assert sink.twice() == [] and len(sink.keys) == 12, "the withdrawn call never ran twice"


def test_hook_queue_is_checked() -> None:
    with pytest.raises(ConfigError, match="hook_queue"):
        Demoter(LAST2, hook_queue=-1)
    with pytest.raises(ConfigError, match="hook_queue"):
        Demoter(LAST2, hook_queue=1.5)  # type: ignore[arg-type]


# -- background retries ----------------------------------------------------------------------


def test_a_conversation_that_ended_with_pending_messages_needs_no_next_load() -> None:
    sink = Sink(fail=1)
    d = Demoter(LAST2, sink, retry=Backoff(0, 0))  # (the background waits 1 s all the same)
    w = d.load("ended", chat(6), describer(d))
    assert w.pending == 4 and d.stats().retrying == 1
    began = time.monotonic()
    assert until(lambda: d.conversation_stats("ended").pending == 0), "delivered, no load"
    assert time.monotonic() - began >= 0.9, "not sooner than 1 s after a failure"
    stats = d.stats()
    assert (stats.retrying, stats.retries, stats.loads, stats.pending) == (0, 1, 1, 0)
    assert len(sink.keys) == 4 and sink.twice() == [] and sink.calls == 2
    assert until(lambda: d._retries._thread is None, 5), "no entries: the thread is gone"


def test_a_load_that_found_its_conversation_busy_is_committed_in_the_background() -> None:
    sink = Sink()
    sink.gate.clear()
    d = Demoter(LAST2, sink, hook_wait=0.05)
    msgs = chat(8)
    first = d.load("c", msgs[:6], describer(d))  # its call goes on in the background
    last = d.load("c", msgs, describer(d))  # the last turn: the conversation is busy
    assert (first.pending, last.pending) == (4, 6) and d.state_of("c").window_start == 4
    sink.gate.set()  # the late call ends; nothing loads the conversation again
    assert until(lambda: d.state_of("c").delivered == 6)
    assert d.state_of("c").window_start == 6, "the last load's window move was committed"
    assert (
        sorted(sink.keys) == sorted(k for i, m in enumerate(msgs[:6]) for k in [_key(d, i, m)])
        and sink.twice() == []
    )


def _key(d: Demoter, i: int, m: Msg) -> str:
    from demote.records import make_key

    return make_key("c", i, describer(d)(m).fingerprint)


def test_a_dead_hook_is_retried_with_backoff_not_hammered() -> None:
    sink = Sink(fail=10_000)
    d = Demoter(LAST2, sink, retry=Backoff(0, 0))
    d.load("c", chat(6), describer(d))
    time.sleep(3.5)  # the background waits 1 s, then 2 s: two retries at most
    assert 2 <= sink.calls <= 3, sink.calls
    assert d.stats().retrying == 1 and d.conversation_stats("c").failures == sink.calls
    d.close()


def test_the_newest_load_is_what_is_retried_and_clear_drops_it() -> None:
    sink = Sink(fail=2)
    d = Demoter(LAST2, sink, retry=Backoff(60, 60))
    msgs = chat(8)
    d.load("c", msgs[:6], describer(d))
    d.load("c", msgs, describer(d))  # backing off: its window moves, nothing is delivered
    assert d.conversation_stats("c").pending == 6 and len(d._retries) == 1
    d.clear("c")
    assert len(d._retries) == 0 and d.stats().retrying == 0
    assert d.drain(5), "nothing pending after a clear"
    assert sink.keys == Counter(), "the cleared history was not demoted again"


def test_retries_are_bounded_by_cached_conversations_and_the_rest_counted() -> None:
    sink = Sink(fail=10_000)
    d = Demoter(LAST2, sink, retry=Backoff(60, 60), cached_conversations=2)
    for n in range(3):
        d.load(f"c{n}", chat(6, str(n)), describer(d))
    stats = d.stats()
    assert (stats.retrying, stats.untracked, stats.pending_conversations) == (2, 1, 3)
    assert "c0" not in d._retries, "the least recently noted went first"
    d.close()


def test_a_demoter_dropped_without_close_lets_its_retry_thread_go() -> None:
    sink = Sink(fail=10_000)
    d = Demoter(LAST2, sink, retry=Backoff(60, 60))
    logging.disable(logging.WARNING)  # (a captured log record would hold the hook's error)
    try:
        d.load("c", chat(6), describer(d))
    finally:
        logging.disable(logging.NOTSET)
    thread = d._retries._thread
    assert thread is not None and thread.is_alive()
    del d
    gc.collect()
    thread.join(5)
    assert not thread.is_alive(), "the thread holds its Demoter weakly: it is gone with it"


# -- drain ------------------------------------------------------------------------------------


def test_drain_delivers_what_is_pending_at_once_whatever_the_backoff() -> None:
    sink = Sink(fail=3)  # c0, c1, c2 fail once each
    d = Demoter(LAST2, sink, retry=Backoff(60, 60))
    for n in range(3):
        assert d.load(f"c{n}", chat(6, str(n)), describer(d)).pending == 4
    began = time.monotonic()
    assert d.drain(10)
    assert time.monotonic() - began < 5, "at once, not after the 60 s backoff"
    assert d.stats().pending == 0 and len(sink.keys) == 12 and sink.twice() == []


def test_drain_tries_a_dead_hook_once_and_says_what_is_left() -> None:
    sink = Sink(fail=10_000)
    d = Demoter(LAST2, sink, retry=Backoff(0.1, 0.1))
    d.load("c", chat(6), describer(d))
    for timeout in (None, 30.0):
        calls, began = sink.calls, time.monotonic()
        assert d.drain(timeout) is False
        assert time.monotonic() - began < 3, "one try, not until the timeout"
        assert sink.calls == calls + 1 and d.conversation_stats("c").pending == 4
    assert d.stats().retrying == 1, "the background retries go on"
    d.close()


def test_drain_waits_for_a_slow_call_then_delivers_what_is_left() -> None:
    sink = Sink()
    sink.gate.clear()
    d = Demoter(LAST2, sink, hook_wait=0.05)
    msgs = chat(8)
    d.load("c", msgs[:6], describer(d))  # its call outlives the wait
    d.load("c", msgs, describer(d))  # busy: the move to 6 is not committed
    threading.Timer(0.3, sink.gate.set).start()
    assert d.drain(20)
    assert d.state_of("c").delivered == 6 and len(sink.keys) == 6 and sink.twice() == []


async def test_an_async_loads_retries_run_on_its_event_loop_and_adrain_awaits_them() -> None:
    loops: list[asyncio.AbstractEventLoop] = []
    fail = [1]

    class LoopBound:
        """An async hook whose client belongs to the loop it was made on."""

        def __init__(self) -> None:
            self.keys: Counter[str] = Counter()

        async def adeliver(self, batch: Demotion) -> None:
            loops.append(asyncio.get_running_loop())
            await asyncio.sleep(0)
            if fail[0]:
                fail[0] -= 1
                raise RuntimeError("down")
            self.keys.update(m.key for m in batch.messages)

    hook = LoopBound()
    d = Demoter(LAST2, hook)
    w = await d.aload("c", chat(6), describer(d))
    assert w.pending == 4
    deadline = time.monotonic() + 15
    while d.conversation_stats("c").pending and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the loop runs: the retry comes to it
    assert d.conversation_stats("c").pending == 0
    here = asyncio.get_running_loop()
    assert loops == [here, here], "retried on the loop of the load, as a task"
    fail[0] = 1
    await d.aload("c2", chat(6, "2"), describer(d))
    assert await d.adrain(10) and d.stats().pending == 0
    assert len(hook.keys) == 8 and max(hook.keys.values()) == 1


def test_a_background_retry_is_fenced_like_any_load_across_workers() -> None:
    store = InMemoryStateStore()
    sink = Sink(fail=1)
    a = Demoter(LAST2, sink, state=store, retry=Backoff(0, 0))
    b = Demoter(LAST2, sink, state=store)  # a second worker on the same store
    msgs = chat(6)
    assert a.load("c", msgs, describer(a)).pending == 4  # a's call failed: a retries
    assert b.load("c", msgs, describer(b)).pending == 0  # b delivers it first
    assert until(lambda: len(a._retries) == 0), "a's retry finds nothing pending, lets go"
    assert sink.twice() == [] and len(sink.keys) == 4


def test_a_refused_call_is_not_hook_busy_forever() -> None:
    sink = Sink()
    sink.gate.clear()
    d = Demoter(LAST2, sink, hook_threads=1, hook_queue=0, hook_wait=0.05)
    d.load("a", chat(6, "a"), describer(d))
    w = d.load("b", chat(6, "b"), describer(d))
    assert w.pending == 4
    assert HookBusy.__name__ in (d.conversation_stats("b").last_error or "")
    sink.gate.set()
    assert until(lambda: d.stats().pending == 0), "b is retried once a thread is free"
    assert len(sink.keys) == 8 and sink.twice() == []


@pytest.mark.parametrize("how", ["clear", "forget"])
def test_a_history_reset_by_another_worker_is_not_replayed(how: str) -> None:
    store = InMemoryStateStore()
    sink = Sink()
    sink.gate.clear()
    a = Demoter(LAST2, sink, state=store, hook_wait=0.05)
    b = Demoter(LAST2, sink, state=store)  # another worker, sharing the store
    old = chat(8, "old")
    a.load("c", old[:6], describer(a))  # its call holds; the conversation stays a's
    assert a.load("c", old, describer(a)).pending == 6 and len(a._retries) == 1
    getattr(b, how)("c")  # b resets it meanwhile (the inner store too, in real life)
    sink.gate.set()  # a's late write lands (it began before); its commit is refused
    assert until(lambda: len(a._retries) == 0), "a's replay found it reset, and let go"
    assert a.stats().untracked == 1
    assert store.get("c") == (None if how == "forget" else a.state_of("c")), "nothing committed"
    assert a.state_of("c").window_start == 0 and sum(sink.keys.values()) == 4, "not replayed"


def test_a_stale_copy_loaded_while_the_hook_fails_is_not_what_is_retried() -> None:
    # A slow request loads a copy read before the newest appends: it is served its own
    # window and changes nothing, so replaying it could never deliver. The retries keep
    # the current history; once the hook is back, a drain delivers everything.
    sink = Sink(fail=1_000)
    d = Demoter(LAST2, sink, retry=Backoff(0, 0))
    msgs = chat(12)
    assert d.load("c", msgs, describer(d)).pending > 0
    stale = d.load("c", msgs[:-1], describer(d))
    assert stale.pending > 0 and stale.messages == msgs[stale.start : len(msgs) - 1]
    sink.fail = 0
    assert d.drain(10), "the retries delivered what was pending"
    assert d.state_of("c").delivered == d.state_of("c").window_start == len(msgs) - 2
    assert len(sink.keys) == len(msgs) - 2 and sink.twice() == []
    d.close()
