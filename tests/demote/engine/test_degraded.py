"""Degraded loads and the store's circuit breaker (no services needed).

The store here is an in-memory store behind a switch that fails its calls the way a store
client does when its server is down (``StoreError`` from a ``ConnectionRefusedError``), or
fails one chosen operation once (a commit after the hook accepted). The services'
own outages (cut and black-holed Redis and PostgreSQL) are in tests/demote/fleet/
test_outage.py. Every loop and wait is bounded.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest

from demote import Backoff, ConversationState, Demoter, SlidingWindow
from demote.backends.breaker import Breaker, Pass, Throttle, breaker_of, is_outage, use_breaker
from demote.errors import ArgumentTypeError, ConfigError, StoreError, StoreUnavailable
from demote.events import DemoteEvent
from demote.records import Demotion, MessageRecord
from demote.state import InMemoryStateStore
from demote.state.base import Lease

LIMIT = 4
POLICY = SlidingWindow.last_messages(LIMIT)


class Switch:
    """An in-memory store whose calls fail, like a client of a server that is down."""

    shared = True

    def __init__(self) -> None:
        self.inner = InMemoryStateStore()
        self.down = False
        self.fail_once: set[str] = set()
        self.calls: Counter[str] = Counter()

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.calls[name] += 1
        if self.down or name in self.fail_once:
            self.fail_once.discard(name)
            try:
                raise ConnectionRefusedError(111, "Connection refused")
            except ConnectionRefusedError as exc:
                raise StoreError(f"store: {exc}") from exc
        return getattr(self.inner, name)(*args, **kwargs)

    def get(self, cid: str) -> ConversationState | None:
        return self._call("get", cid)  # type: ignore[no-any-return]

    def compare_and_set(
        self,
        cid: str,
        expected: ConversationState | None,
        new: ConversationState,
        *,
        lease: Lease | None = None,
        release: bool = False,
    ) -> bool:
        return self._call(  # type: ignore[no-any-return]
            "compare_and_set", cid, expected, new, lease=lease, release=release
        )

    def clear(self, cid: str) -> ConversationState:
        return self._call("clear", cid)  # type: ignore[no-any-return]

    def delete(self, cid: str) -> None:
        self._call("delete", cid)

    def count(self) -> int:
        return self.inner.count()

    def acquire_lease(self, cid: str, holder: str, ttl: float) -> Lease | None:
        return self._call("acquire_lease", cid, holder, ttl)  # type: ignore[no-any-return]

    def renew_lease(self, lease: Lease, ttl: float) -> bool:
        return self._call("renew_lease", lease, ttl)  # type: ignore[no-any-return]

    def release_lease(self, lease: Lease) -> None:
        self._call("release_lease", lease)

    def close(self) -> None:
        pass


class Sink:
    """Records every key; ``probe`` makes it a key-aware hook (``has_keys``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: Counter[str] = Counter()

    def deliver(self, batch: Demotion) -> None:
        with self.lock:
            self.keys.update(m.key for m in batch.messages)

    def twice(self) -> list[str]:
        return [k for k, n in self.keys.items() if n > 1]


class KeySink(Sink):
    def has_keys(self, cid: str, keys: list[str]) -> set[str]:
        with self.lock:
            return {k for k in keys if k in self.keys}


def describe(d: Demoter) -> Any:
    def fn(m: tuple[str, str]) -> MessageRecord:
        return d.describe(m[0], m[1])

    return fn


def history(n: int, system: bool = True) -> list[tuple[str, str]]:
    head = [("system", "be brief")] if system else []
    return head + [("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(n)]


def make(store: Any, hook: Any = None, **kw: Any) -> Demoter:
    use_breaker(store, Breaker(jitter=0.0))  # a fresh breaker per test, no randomness
    return Demoter(POLICY, hook if hook is not None else Sink(), state=store, **kw)


def wait_closed(store: Any, seconds: float = 5.0) -> None:
    """Wait out the breaker's probe interval (bounded)."""
    deadline = time.monotonic() + seconds
    while breaker_of(store).retry_in() > 0 and time.monotonic() < deadline:
        time.sleep(0.02)


# --- degraded loads ------------------------------------------------------------------


def test_a_load_whose_store_is_down_returns_a_bounded_window_planned_from_the_history() -> None:
    store, sink = Switch(), Sink()
    d = make(store, sink)
    msgs = history(12)
    store.down = True
    w = d.load("c", msgs, describe(d))
    assert w.degraded
    assert w.pinned == [("system", "be brief")]  # pinned kept
    assert 0 < len(w.messages) <= LIMIT and w.messages == msgs[w.start :]
    assert w.messages[0][0] == "user"
    (event,) = [e for e in w.events if e.kind == "degraded"]
    assert (event.source, event.start, event.end) == ("state", w.start, len(msgs))
    assert "Connection refused" in (event.error or "")
    assert sink.keys == Counter()  # no delivery
    assert store.inner.get("c") is None  # no commit
    assert d.stats().degraded == 1


def test_a_healthy_load_is_not_degraded() -> None:
    d = make(Switch())
    w = d.load("c", history(12), describe(d))
    assert not w.degraded and all(e.kind != "degraded" for e in w.events)


def test_once_open_the_breaker_skips_the_store_then_one_probe_closes_it() -> None:
    store = Switch()
    d = make(store)
    msgs = history(12)
    store.down = True
    d.load("c", msgs, describe(d))
    gets = store.calls["get"]
    for _ in range(5):  # within the probe interval: the store is not called at all
        w = d.load("c", msgs, describe(d))
        assert w.degraded and "StoreUnavailable" in (w.events[-1].error or "")
    assert store.calls["get"] == gets
    store.down = False
    wait_closed(store)
    w = d.load("c", msgs, describe(d))
    assert not w.degraded and breaker_of(store).state == "closed"
    assert store.calls["get"] == gets + 1


def test_the_store_is_back_the_next_load_catches_up_and_delivers_each_message_once() -> None:
    store, sink = Switch(), Sink()
    d = make(store, sink)
    msgs = history(6)
    d.load("c", msgs, describe(d))
    store.down = True
    for i in range(6, 20, 2):
        msgs += [("user", f"m{i}"), ("assistant", f"m{i + 1}")]
        assert d.load("c", msgs, describe(d)).degraded
    store.down = False
    wait_closed(store)
    w = d.load("c", msgs, describe(d))
    assert not w.degraded and w.pending == 0
    state = store.inner.get("c")
    assert state is not None and state.delivered == state.window_start == w.start
    assert sink.twice() == []
    assert len(sink.keys) == w.start - 1  # every demoted message (not the pinned one)


@pytest.mark.parametrize("hook", [Sink, KeySink], ids=["no has_keys", "has_keys"])
def test_a_commit_that_fails_after_the_hook_accepted_is_not_delivered_again(
    hook: type[Sink],
) -> None:
    store, sink = Switch(), hook()
    d = make(store, sink)
    msgs = history(4)
    d.load("c", msgs, describe(d))
    msgs += history(8, system=False)
    store.fail_once = {"compare_and_set"}
    w = d.load("c", msgs, describe(d))
    assert w.degraded and any(e.kind == "delivered" for e in w.events)
    delivered = sum(sink.keys.values())
    assert delivered > 0
    wait_closed(store)
    w = d.load("c", msgs, describe(d))  # the same pending range, planned again
    assert not w.degraded and w.pending == 0
    assert sink.twice() == [] and sum(sink.keys.values()) == delivered


def test_a_lease_left_behind_by_a_failed_commit_does_not_hold_demotion_off() -> None:
    store = Switch()
    d = make(store, lease_ttl=60.0)  # without the release, 60 s before it expires
    msgs = history(4)
    d.load("c", msgs, describe(d))
    msgs += history(8, system=False)
    store.fail_once = {"compare_and_set", "release_lease"}
    assert d.load("c", msgs, describe(d)).degraded
    wait_closed(store)
    d._delivery.keeper.close()  # no background release either: the next load must do it
    msgs += history(8, system=False)
    w = d.load("c", msgs, describe(d))
    assert not w.degraded and w.pending == 0 and w.demoted > 0


def test_a_lease_release_while_the_breaker_is_open_costs_no_call_and_is_done_later() -> None:
    """A load whose hook failed again, with nothing to commit, gives its lease back; with
    the store found down meanwhile (by another caller) the release is skipped, not waited
    on, and the next load that takes the conversation releases it first."""
    store = Switch()

    class Failing(Sink):
        fail, take_the_store = True, False

        def deliver(self, batch: Demotion) -> None:
            if self.take_the_store:  # another caller finds the store down meanwhile
                store.down = True
                ticket = breaker_of(store).admit()
                assert ticket is not None
                breaker_of(store).failed(ticket)
            if self.fail:
                raise RuntimeError("the sink is down")
            super().deliver(batch)

    sink = Failing()
    d = make(store, sink, lease_ttl=60.0, retry=Backoff(initial=0.0))
    msgs = history(12)
    d.load("c", msgs, describe(d))  # the window moved, its messages pending
    sink.take_the_store = True
    d.load("c", msgs, describe(d))  # a retry: the hook fails, nothing to commit
    assert store.calls["release_lease"] == 0, "skipped while the breaker was open"
    assert store.inner.acquire_lease("c", "other", 1.0) is None, "the lease is still held"
    store.down, sink.fail, sink.take_the_store = False, False, False
    wait_closed(store)
    w = d.load("c", msgs, describe(d))
    assert store.calls["release_lease"] >= 1, "released by the next load"
    assert not w.degraded and w.pending == 0 and w.demoted > 0
    assert store.inner.acquire_lease("c", "other", 1.0) is not None, "and free again"


def test_a_late_delivery_whose_commit_fails_is_not_handed_over_again() -> None:
    """A hook call that outlived ``hook_wait`` succeeds while the store fails its late
    commit: the hook has the batch, so the next delivery asks it (``has_keys``)."""
    store = Switch()
    release = threading.Event()

    class Slow(KeySink):
        def deliver(self, batch: Demotion) -> None:
            assert release.wait(5)
            super().deliver(batch)

    sink = Slow()
    d = make(store, sink, hook_wait=0.05, retry=Backoff(initial=0.0))
    msgs = history(12)
    d.load("c", msgs, describe(d))  # the call goes on in the background
    store.fail_once = {"get"}  # the late commit reads the state first: that read fails
    release.set()
    assert d.drain(5)
    assert sink.keys, "the hook took the batch"
    wait_closed(store)
    w = d.load("c", msgs, describe(d))
    assert sink.twice() == [], "handed over again"
    assert not w.degraded and w.pending == 0


def test_the_warning_is_logged_once_per_period_not_per_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Switch()
    d = make(store)
    store.down = True
    with caplog.at_level(logging.WARNING, logger="demote"):
        for _ in range(20):
            d.load("c", history(12), describe(d))
    warned = [r for r in caplog.records if "state store failed" in r.getMessage()]
    assert len(warned) == 1
    store.down = False
    wait_closed(store)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="demote"):
        d.load("c", history(12), describe(d))
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_observers_receive_the_degraded_event() -> None:
    store = Switch()
    d = make(store)
    seen: list[DemoteEvent] = []
    d.observe(seen.append)
    store.down = True
    d.load("c", history(12), describe(d))
    d._observers.wait_idle(5)
    assert [e.kind for e in seen] == ["degraded"]


def test_on_store_error_raise_keeps_the_old_behaviour() -> None:
    store = Switch()
    d = make(store, on_store_error="raise")
    store.down = True
    with pytest.raises(StoreError, match="refused"):
        d.load("c", history(12), describe(d))
    with pytest.raises(StoreUnavailable):  # open: raised at once, the store not called
        d.load("c", history(12), describe(d))
    assert store.calls["get"] == 1


@pytest.mark.parametrize("bad", ["log", "", None, True])
def test_on_store_error_is_validated(bad: Any) -> None:
    with pytest.raises(ConfigError, match="on_store_error"):
        Demoter(POLICY, on_store_error=bad)


def test_report_degraded_checks_its_source() -> None:
    d = Demoter(POLICY)
    event = d.report_degraded("c", "recall", StoreError("archive closed"))
    assert (event.kind, event.source) == ("degraded", "recall")
    assert event.to_dict()["source"] == "recall"
    with pytest.raises(ConfigError, match="source"):
        d.report_degraded("c", "hook", StoreError("x"))  # type: ignore[arg-type]


def test_bad_data_for_one_conversation_degrades_it_without_opening_the_breaker() -> None:
    assert is_outage(StoreError("x")) is False
    store = Switch()
    d = make(store)
    store.inner.compare_and_set("bad", None, ConversationState())

    def corrupt(cid: str) -> ConversationState | None:
        if cid == "bad":
            raise StoreError("stored conversation state has 3 fields, not 10")
        return store.inner.get(cid)

    store.get = corrupt  # type: ignore[method-assign]
    assert d.load("bad", history(12), describe(d)).degraded
    assert breaker_of(store).state == "closed"
    assert not d.load("good", history(12), describe(d)).degraded


async def test_async_loads_degrade_and_recover_the_same_way() -> None:
    store, sink = Switch(), Sink()
    d = make(store, sink)
    msgs = history(12)
    store.down = True
    windows = await asyncio.gather(*(d.aload(f"c{i}", msgs, describe(d)) for i in range(8)))
    assert all(w.degraded and len(w.messages) <= LIMIT for w in windows)
    store.down = False
    wait_closed(store)
    # One probe at a time: loads beside it are still skipped, until it closes the breaker.
    assert not (await d.aload("c0", msgs, describe(d))).degraded
    windows = await asyncio.gather(*(d.aload(f"c{i}", msgs, describe(d)) for i in range(8)))
    assert not any(w.degraded for w in windows)
    assert sink.twice() == []


def test_sixteen_threads_through_an_outage_every_load_returns_and_nothing_is_lost() -> None:
    store, sink = Switch(), KeySink()
    d = make(store, sink, hook_threads=16)  # 16 chats may catch up at once
    errors: list[BaseException] = []
    degraded = Counter[str]()
    chats = {f"c{i}": history(2) for i in range(16)}

    def chat(cid: str) -> None:
        msgs = chats[cid]
        for n in range(30):
            msgs += [("user", f"q{n}"), ("assistant", f"a{n}")]
            try:
                w = d.load(cid, list(msgs), describe(d))
            except BaseException as exc:
                errors.append(exc)
                return
            assert len(w.messages) <= LIMIT
            degraded[cid] += w.degraded
            time.sleep(0.005)

    threads = [threading.Thread(target=chat, args=(cid,)) for cid in chats]
    for t in threads:
        t.start()
    time.sleep(0.05)
    store.down = True
    time.sleep(0.3)
    store.down = False
    for t in threads:
        t.join(60)
    assert errors == [] and sum(degraded.values()) > 0
    wait_closed(store)
    for cid, msgs in chats.items():
        w = d.load(cid, msgs, describe(d))
        assert not w.degraded and w.pending == 0
    assert sink.twice() == []
    assert len(sink.keys) == sum(d.load(c, m, describe(d)).start - 1 for c, m in chats.items())


# --- the breaker ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_probe_interval_doubles_up_to_the_cap_and_closes_on_the_first_success() -> None:
    clock = Clock()
    b = Breaker(first=0.1, factor=2, cap=0.5, jitter=0.0, clock=clock)
    b.failed(b.admit() or Pass(0))
    waits = []
    for _ in range(5):
        waits.append(round(b.retry_in(), 3))
        assert b.admit() is None  # open
        clock.now += b.retry_in()
        probe = b.admit()
        assert probe is not None and probe.probe
        b.failed(probe)
    assert waits == [0.1, 0.2, 0.4, 0.5, 0.5]
    clock.now += b.retry_in()
    probe = b.admit()
    assert probe is not None
    b.succeeded(probe)
    assert b.state == "closed" and b.retry_in() == 0
    assert b.admit() == Pass(b.opened)


def test_jitter_spreads_each_interval_within_its_bounds() -> None:
    for r in (0.0, 0.5, 0.999):
        clock = Clock()
        b = Breaker(first=1.0, jitter=0.2, cap=1.0, clock=clock, rand=lambda r=r: r)
        b.failed(Pass(0))
        assert 0.8 - 1e-9 <= b.retry_in() <= 1.2 + 1e-9


def test_exactly_one_probe_is_in_flight_across_threads() -> None:
    clock = Clock()
    b = Breaker(jitter=0.0, clock=clock)
    b.failed(Pass(0))
    clock.now += 1
    barrier = threading.Barrier(16)
    got: list[Pass | None] = []

    def ask() -> None:
        barrier.wait(5)
        got.append(b.admit())

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    probes = [p for p in got if p is not None]
    assert len(got) == 16 and len(probes) == 1 and probes[0].probe
    assert b.state == "probing"


async def test_exactly_one_probe_is_in_flight_across_tasks() -> None:
    clock = Clock()
    b = Breaker(jitter=0.0, clock=clock)
    b.failed(Pass(0))
    clock.now += 1

    async def ask() -> Pass | None:
        await asyncio.sleep(0)
        return b.admit()

    got = await asyncio.gather(*(ask() for _ in range(16)))
    assert sum(p is not None for p in got) == 1


def test_calls_in_flight_when_it_opened_neither_lengthen_nor_close_it() -> None:
    clock = Clock()
    b = Breaker(jitter=0.0, clock=clock)
    early = [b.admit() for _ in range(3)]
    assert all(p is not None for p in early)
    b.failed(early[0])  # type: ignore[arg-type]
    b.failed(early[1])  # type: ignore[arg-type]
    assert round(b.retry_in(), 3) == 0.1 and b.opened == 1
    b.succeeded(early[2])  # type: ignore[arg-type]
    assert b.state == "open"


def test_an_abandoned_or_lost_probe_lets_another_call_probe() -> None:
    clock = Clock()
    b = Breaker(jitter=0.0, clock=clock, probe_timeout=5.0)
    b.failed(Pass(0))
    clock.now += 1
    probe = b.admit()
    assert probe is not None and b.admit() is None
    b.abandon(probe)
    second = b.admit()
    assert second is not None and second.probe
    clock.now += 6  # never reported
    assert b.admit() is not None


def test_one_breaker_per_store_object_shared_by_its_demoters() -> None:
    store = InMemoryStateStore()
    assert breaker_of(store) is breaker_of(store)
    assert breaker_of(store) is not breaker_of(InMemoryStateStore())
    d1, d2 = Demoter(POLICY, state=store), Demoter(POLICY, state=store)
    assert d1._delivery.breaker is d2._delivery.breaker is breaker_of(store)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"first": 0}, "first"),
        ({"cap": 0.01}, "cap"),
        ({"factor": 0.5}, "factor"),
        ({"factor": float("nan")}, "factor"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": True}, "jitter"),
        ({"probe_timeout": -1}, "probe_timeout"),
    ],
)
def test_breaker_options_are_validated(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Breaker(**kwargs)


def test_use_breaker_wants_a_breaker() -> None:
    with pytest.raises(ArgumentTypeError, match="breaker"):
        use_breaker(InMemoryStateStore(), "fast")  # type: ignore[arg-type]


def test_the_throttle_lets_one_message_a_period_through_and_counts_the_rest() -> None:
    clock = Clock()
    t = Throttle(60, clock=clock)
    assert t.ready("state") == 0
    assert [t.ready("state") for _ in range(3)] == [None] * 3
    assert t.ready("recall") == 0  # keys are apart
    clock.now += 61
    assert t.ready("state") == 3
