"""A holder whose lease was taken over commits nothing: every path, every shared store.

Two Demoters share one store (an SQLite file, a Redis prefix, a PostgreSQL table), as two
processes would. A's renewals never reach the store (:class:`LostRenewals`: ``renew_lease``
fails as a call across a partition does; every other call goes through, as it does once
the partition heals), so while A is held inside its hook (a load waiting for it, the
background continuation after ``hook_wait``, a summary's delivery, an erase's tier), its
lease runs out and B takes the conversation over: B writes its batch to the shared sink,
then holds before its commit, so the committed state is still the one A started from and
only the fence can refuse A. Then A is let go: its commit must be refused, its late write
is refused by the fence-checking sink, and once B commits every key is in the sink once.

A runs on ``load`` or on ``aload`` (a native async hook, awaited store twins); B on
``load``. The multi-process form, with A's connection cut by a TCP proxy, is in
tests/demote/fleet/test_fleet_partition.py. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from demote import Compact, ConversationState, Demoter, Demotion, SlidingWindow
from demote.errors import StoreError
from demote.summarize import TemplateSummarizer
from tests.demote.state.conftest import DURABLE, opener

TTL = 0.5  # A's lease time; it expires while A is held
#: B's lease time: B's keeper renews it, but on a loaded machine (CI, two cores) a keeper
#: thread can be starved past half a second; B's lease lapsing is not what these tests are
#: about, so B's outlives every wait.
B_TTL = 30.0
PATIENCE = 10.0  # the longest any one wait of these tests lasts
POLICY = SlidingWindow.last_messages(4)
Msg = tuple[str, str]


def chat(n: int) -> list[Msg]:
    return [(("user", "assistant")[i % 2], f"message {i}") for i in range(n)]


class LostRenewals:
    """A store seen from behind a partition that loses A's renewals (only those).

    A renewal fails as a timed-out call does (the keeper retries it on its next tick);
    every other call reaches the real store. ``lost = False`` heals it.
    """

    def __init__(self, store: Any) -> None:
        self._store = store
        self.lost = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def renew_lease(self, lease: Any, ttl: float) -> bool:
        if self.lost:
            raise StoreError("renewal lost: no reply within 0.5 s (partition)")
        return bool(self._store.renew_lease(lease, ttl))

    async def arenew_lease(self, lease: Any, ttl: float) -> bool:
        if self.lost:
            raise StoreError("renewal lost: no reply within 0.5 s (partition)")
        return bool(await self._store.arenew_lease(lease, ttl))


class Sink:
    """The long tail both workers share; it refuses a batch older than the newest fence."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: Counter[str] = Counter()
        self.owner: dict[str, str] = {}  # key -> conversation
        self.fences: dict[str, int] = {}
        self.refused: list[tuple[str, int | None]] = []

    def write(self, worker: str, batch: Demotion) -> None:
        with self.lock:
            cid, fence = batch.conversation_id, batch.fence
            assert fence is not None, "a shared store fences every batch"
            if fence < self.fences.get(cid, 0):
                self.refused.append((worker, fence))
                raise RuntimeError(f"stale writer {worker} (fence {fence})")
            self.fences[cid] = fence
            self.keys.update(m.key for m in batch.messages)
            self.owner.update((m.key, cid) for m in batch.messages)

    def erase(self, cid: str, fence: int | None) -> None:
        with self.lock:
            self.fences[cid] = max(self.fences.get(cid, 0), fence or 0)
            for k in [k for k, owner in self.owner.items() if owner == cid]:
                del self.keys[k], self.owner[k]

    def duplicates(self) -> list[str]:
        return [k for k, n in self.keys.items() if n > 1]


class Held:
    """A worker's hook: its first delivery (or erase) holds until released.

    ``when="after"`` writes to the sink before holding (B: its batch is in the sink, its
    commit not yet made); ``"before"`` holds first (A: its write comes late). ``erase``
    makes it a tier whose erase holds instead.
    """

    def __init__(self, sink: Sink, name: str, when: str = "before", erase: bool = False) -> None:
        self.sink = sink
        self.name = name
        self.when = when
        self.holds_erase = erase
        self.entered = threading.Event()
        self.release = threading.Event()
        self.erase_fence: int | None = None
        self.calls = 0

    def _hold(self) -> bool:
        first = not self.entered.is_set()
        self.entered.set()
        return first

    def deliver(self, batch: Demotion) -> None:
        self.calls += 1
        if self.when == "after" or self.holds_erase:
            self.sink.write(self.name, batch)
        if not self.holds_erase and self._hold() and not self.release.wait(PATIENCE):
            raise TimeoutError("never released")
        if self.when == "before" and not self.holds_erase:
            self.sink.write(self.name, batch)

    async def adeliver(self, batch: Demotion) -> None:
        self.calls += 1
        if self.when == "after" or self.holds_erase:
            self.sink.write(self.name, batch)
        if not self.holds_erase and self._hold():
            for _ in range(int(PATIENCE / 0.01)):
                if self.release.is_set():
                    break
                await asyncio.sleep(0.01)
        if self.when == "before" and not self.holds_erase:
            self.sink.write(self.name, batch)

    def erase(self, conversation_id: str, *, fence: int | None = None, keys: Any = None) -> int:
        self.erase_fence = fence
        self.sink.erase(conversation_id, fence)
        if self.holds_erase and self._hold() and not self.release.wait(PATIENCE):
            raise TimeoutError("never released")
        return 0


class Side:
    """Runs A's calls: ``load`` on a thread, or ``aload`` on an event loop of its own."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.pool = ThreadPoolExecutor(2)
        self.loop: asyncio.AbstractEventLoop | None = None
        if mode == "async":
            self.loop = asyncio.new_event_loop()
            self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self.thread.start()

    def start(self, demoter: Demoter, name: str, *args: Any, **kwargs: Any) -> Future[Any]:
        if self.loop is None:
            return self.pool.submit(getattr(demoter, name), *args, **kwargs)
        coro = getattr(demoter, "a" + name)(*args, **kwargs)
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def drain(self, demoter: Demoter) -> bool:
        if self.loop is None:
            return demoter.drain(PATIENCE)
        done = asyncio.run_coroutine_threadsafe(demoter.adrain(PATIENCE), self.loop)
        return bool(done.result(PATIENCE + 5))

    def close(self, store: Any) -> None:
        if self.loop is not None:
            if hasattr(store, "aclose"):
                asyncio.run_coroutine_threadsafe(store.aclose(), self.loop).result(PATIENCE)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(PATIENCE)
            self.loop.close()
        self.pool.shutdown(wait=True)


class Pair:
    """A's store (renewals lost) and B's, on one namespace; the sink; A's side."""

    def __init__(self, open_raw: Callable[..., Any], side: Side) -> None:
        self.raw_a, self.raw_b = open_raw(), open_raw()
        self.a_store = LostRenewals(self.raw_a)
        self.side = side
        self.sink = Sink()
        self.demoters: list[Demoter] = []

    def demoter(self, store: Any, hook: Held, **kwargs: Any) -> Demoter:
        kwargs.setdefault("policy", POLICY)
        kwargs.setdefault("lease_ttl", TTL if store is self.a_store else B_TTL)
        made = Demoter(kwargs.pop("policy"), hook, state=store, **kwargs)
        self.demoters.append(made)
        return made

    def state(self, cid: str) -> ConversationState | None:
        return self.raw_b.get(cid)  # type: ignore[no-any-return]

    def take_over(self, b: Demoter, hook: Held, cid: str, msgs: list[Msg]) -> Future[Any]:
        """B loads until it holds the lease A lost (its hook entered), on its own thread.

        The future ends once B's delivery is committed: the load that entered B's hook may
        be B's background retry of a load that found A's lease (then the foreground load
        returns at once, its window pending), so B is drained before the future ends.
        """

        def loads() -> Any:
            deadline = time.monotonic() + PATIENCE
            while time.monotonic() < deadline:
                window = b.load(cid, msgs, lambda m: b.describe(m[0], m[1]))
                if hook.entered.is_set():
                    if not b.drain(PATIENCE):
                        raise TimeoutError("B's delivery never ended")
                    return window
                time.sleep(0.05)
            raise TimeoutError("B never took the conversation over")

        future = self.side.pool.submit(loads)
        assert hook.entered.wait(PATIENCE), "B took the conversation over"
        return future

    def close(self) -> None:
        for d in self.demoters:
            d.close()
        self.side.close(self.raw_a)
        self.raw_a.close()
        self.raw_b.close()


@pytest.fixture(params=DURABLE)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    side = Side(request.node.callspec.params["side"])
    made = Pair(opener(request.param, request, tmp_path), side)
    try:
        yield made
    finally:
        made.close()


def describe_with(d: Demoter) -> Callable[[Msg], Any]:
    return lambda m: d.describe(m[0], m[1])


SIDES = pytest.mark.parametrize("side", ["sync", "async"])


#: B writes its batch to the sink before it holds (the sink then refuses A's late write,
#: and nothing is there twice), or after (A's write is taken: only the store's fence can
#: refuse A's commit; the sink then holds A's copy and B's, as at-least-once allows).
WRITES = pytest.mark.parametrize("b_writes", ["first", "last"])


def b_hook(pair: Pair, b_writes: str) -> Held:
    return Held(pair.sink, "b", when="after" if b_writes == "first" else "before")


def check_sink(pair: Pair, b_writes: str, n: int) -> None:
    if b_writes == "first":
        assert [w for w, _ in pair.sink.refused] == ["a"], "A's late write, by the sink"
        assert pair.sink.duplicates() == []
    else:
        assert pair.sink.refused == []
    assert len(pair.sink.keys) == n


@SIDES
@WRITES
@pytest.mark.parametrize("max_batch", [100, 8], ids=["one-batch", "backlog"])
def test_a_load_waiting_for_its_hook_past_a_takeover_commits_nothing(
    pair: Pair, side: str, b_writes: str, max_batch: int
) -> None:
    # In a backlog (two batches of 8) the refused commit is the one after the first batch,
    # which makes its progress durable: A then stops, and hands the hook nothing more.
    cid, msgs = "waited", chat(20)
    hook_a, hook_b = Held(pair.sink, "a"), b_hook(pair, b_writes)
    a = pair.demoter(pair.a_store, hook_a, hook_wait=None, max_batch=max_batch)
    b = pair.demoter(pair.raw_b, hook_b, hook_wait=None)
    loading = pair.side.start(a, "load", cid, msgs, describe_with(a))
    assert hook_a.entered.wait(PATIENCE)
    taking = pair.take_over(b, hook_b, cid, msgs)

    hook_a.release.set()
    window = loading.result(PATIENCE)
    assert pair.state(cid) is None, "the stale holder's commit was refused"
    assert (window.delivered, window.pending) == (0, 16)
    assert hook_a.calls == 1, "nothing more was handed to A's hook once a commit was refused"

    hook_b.release.set()
    taking.result(PATIENCE)
    state = pair.state(cid)
    assert state is not None and (state.window_start, state.delivered) == (16, 16)
    check_sink(pair, b_writes, 16)


@SIDES
@WRITES
def test_the_late_commit_after_hook_wait_is_refused_after_a_takeover(
    pair: Pair, side: str, b_writes: str
) -> None:
    cid, msgs = "late", chat(20)
    hook_a, hook_b = Held(pair.sink, "a"), b_hook(pair, b_writes)
    a = pair.demoter(pair.a_store, hook_a, hook_wait=0.05)
    b = pair.demoter(pair.raw_b, hook_b, hook_wait=None)
    window = pair.side.start(a, "load", cid, msgs, describe_with(a)).result(PATIENCE)
    assert hook_a.entered.is_set() and window.pending == 16  # its hook call goes on
    moved = pair.state(cid)
    assert moved is not None and (moved.window_start, moved.delivered) == (16, 0)
    taking = pair.take_over(b, hook_b, cid, msgs)

    hook_a.release.set()
    assert pair.side.drain(a), "the background continuation ended"
    assert pair.state(cid) == moved, "its late commit was refused: B holds the lease"

    hook_b.release.set()
    taking.result(PATIENCE)
    state = pair.state(cid)
    assert state is not None and (state.window_start, state.delivered) == (16, 16)
    check_sink(pair, b_writes, 16)


@SIDES
def test_a_summary_delivered_past_a_takeover_is_not_committed(pair: Pair, side: str) -> None:
    cid = "compact"
    msgs = [("system", "be terse"), *chat(12)]  # over limit + compact_count: a summary
    policy = SlidingWindow.last_messages(6, eviction=Compact(compact_count=4))
    hook_a, hook_b = Held(pair.sink, "a"), Held(pair.sink, "b", when="after")
    a = pair.demoter(
        pair.a_store, hook_a, policy=policy, summarizer=TemplateSummarizer(), hook_wait=None
    )
    b = pair.demoter(
        pair.raw_b, hook_b, policy=policy, summarizer=TemplateSummarizer(), hook_wait=None
    )
    window = pair.side.start(a, "load", cid, msgs, describe_with(a)).result(PATIENCE)
    assert window.summary is None  # the summary is written in the background
    before = pair.state(cid)  # the load's own commit (the pinned prefix), made before it
    assert before is not None and before.summary is None
    assert hook_a.entered.wait(PATIENCE), "A's summary took the lease and delivers"
    b.load(cid, msgs, describe_with(b))  # B's own summary waits for the lease, then takes it
    assert hook_b.entered.wait(PATIENCE)

    hook_a.release.set()
    assert pair.side.drain(a)
    assert pair.state(cid) == before, "A's summary was not committed: B holds the lease"
    assert [w for w, _ in pair.sink.refused] == ["a"]

    hook_b.release.set()
    assert b.drain(PATIENCE)
    state = pair.state(cid)
    assert state is not None and state.summary is not None
    assert state.delivered == state.window_start == state.summarized > 1
    assert pair.sink.duplicates() == [] and len(pair.sink.keys) == state.delivered - 1


@SIDES
def test_an_erase_whose_lease_was_taken_over_is_not_complete(pair: Pair, side: str) -> None:
    cid = "erase"
    tier, hook_b = Held(pair.sink, "a", erase=True), Held(pair.sink, "b", when="after")
    a = pair.demoter(pair.a_store, tier, hook_wait=None)
    b = pair.demoter(pair.raw_b, hook_b, hook_wait=None)
    pair.side.start(a, "load", cid, chat(20), describe_with(a)).result(PATIENCE)
    assert len(pair.sink.keys) == 16  # delivered before the erase (its hook does not hold)

    erasing = pair.side.start(a, "erase", cid)
    assert tier.entered.wait(PATIENCE), "the erase holds in its tier"
    taking = pair.take_over(b, hook_b, cid, chat(24))  # B delivers 16..20 after the erase
    assert tier.erase_fence is not None and pair.sink.fences[cid] > tier.erase_fence
    assert len(pair.sink.keys) == 4, "the tier holds B's batch, written after its erase"

    pair.a_store.lost = False  # the partition heals: the erase can ask whose lease it is
    tier.release.set()
    report = erasing.result(PATIENCE)
    assert report.took_over and not report.complete, "B's batch reached the tier after it"
    hook_b.release.set()
    taking.result(PATIENCE)


class FailsOnce:
    """A real store whose next call of ``method`` (or its twin) fails as a cut one does."""

    def __init__(self, store: Any, method: str) -> None:
        self._store = store
        self.method: str | None = method

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _call(self, name: str, *args: Any) -> Any:
        if self.method == name:
            self.method = None
            raise StoreError("redis: ConnectionError: connection reset by peer")
        return getattr(self._store, name)(*args)

    async def _acall(self, name: str, *args: Any) -> Any:
        if self.method == name:
            self.method = None
            raise StoreError("redis: ConnectionError: connection reset by peer")
        return await getattr(self._store, "a" + name)(*args)

    def get(self, conversation_id: str) -> Any:
        return self._call("get", conversation_id)

    async def aget(self, conversation_id: str) -> Any:
        return await self._acall("get", conversation_id)

    def acquire_lease(self, conversation_id: str, holder: str, ttl: float) -> Any:
        return self._call("acquire_lease", conversation_id, holder, ttl)

    async def aacquire_lease(self, conversation_id: str, holder: str, ttl: float) -> Any:
        return await self._acall("acquire_lease", conversation_id, holder, ttl)


@SIDES
def test_an_erase_whose_lease_request_failed_leaves_the_conversation_free(
    pair: Pair, side: str
) -> None:
    # Compaction and erase take the gate, then ask for the lease: a failed request must
    # give the gate back, or this process never demotes the conversation again.
    cid, store = "gate", FailsOnce(pair.raw_a, "acquire_lease")
    hook = Held(pair.sink, "a", erase=True)
    hook.release.set()
    a = pair.demoter(store, hook, hook_wait=None)
    with pytest.raises(StoreError):
        pair.side.start(a, "erase", cid).result(PATIENCE)
    window = pair.side.start(a, "load", cid, chat(20), describe_with(a)).result(PATIENCE)
    assert (window.delivered, window.pending) == (16, 0), "the gate was given back"
    state = pair.state(cid)
    assert state is not None and state.delivered == 16


@SIDES
def test_a_late_commit_that_fails_leaves_its_lease_to_the_next_load(pair: Pair, side: str) -> None:
    # The continuation after hook_wait reads the state before its commit; that read fails.
    # The lease it still holds must not keep its own process's next load out: that load
    # gives it back first (the keeper, which would release it later, is stopped here, and
    # the lease lasts 30 s).
    cid, store = "stranded", FailsOnce(pair.raw_a, "")
    hook = Held(pair.sink, "a")
    a = pair.demoter(store, hook, hook_wait=0.05, lease_ttl=30.0)
    first = pair.side.start(a, "load", cid, chat(20), describe_with(a)).result(PATIENCE)
    assert first.pending == 16 and hook.entered.is_set()  # the call goes on
    a._delivery.keeper.close()
    store.method = "get"
    hook.release.set()
    assert pair.side.drain(a)
    assert len(pair.sink.keys) == 16, "the hook took the batch; its commit failed"
    window = pair.side.start(a, "load", cid, chat(20), describe_with(a)).result(PATIENCE)
    assert (window.delivered, window.pending) == (16, 0), "the next load was not kept out"
