"""Many threads and asyncio tasks loading the same and different conversations at once,
with appends in between: nothing lost, nothing delivered twice, nothing crosses over."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from pathlib import Path

import pytest

from demote import Demoter, Demotion, SlidingWindow, SQLiteStateStore
from demote.records import fingerprint, make_key
from tests.strategies import Msg, describer

CIDS = [f"conv-{i}" for i in range(4)]


class Ledger:
    """A thread-safe hook: who got what, under which conversation id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: Counter[str] = Counter()
        self.owner: dict[str, str] = {}
        self.crossed: list[tuple[str, str]] = []

    def deliver(self, batch: Demotion) -> None:
        with self.lock:
            for m in batch.messages:
                self.count[m.key] += 1
                self.owner[m.key] = batch.conversation_id
                if not m.text.startswith(batch.conversation_id + "/"):
                    self.crossed.append((batch.conversation_id, m.text))

    async def adeliver(self, batch: Demotion) -> None:
        await asyncio.sleep(0)
        self.deliver(batch)

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        # Like SQLiteArchive (a stale snapshot is recognised without it: see
        # test_stale_shorter_snapshot_is_not_a_rewrite).
        with self.lock:
            return {k for k in keys if self.owner.get(k) == conversation_id}


class Chats:
    """Shared histories; an append and the snapshot a loader reads happen under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.histories: dict[str, list[Msg]] = {cid: [] for cid in CIDS}
        self.serial = 0

    def append_and_snapshot(self, cid: str, n: int) -> list[Msg]:
        with self.lock:
            history = self.histories[cid]
            for _ in range(n):
                self.serial += 1
                role = "user" if len(history) % 2 == 0 else "assistant"
                history.append(Msg(role, f"{cid}/{self.serial}"))
            return list(history)


def check(d: Demoter, hook: Ledger, chats: Chats) -> None:
    assert hook.crossed == [], "a message was delivered under another conversation's id"
    assert [k for k, n in hook.count.items() if n > 1] == [], "a key was delivered twice"
    for cid in CIDS:
        history = chats.histories[cid]
        w = d.load(cid, history, describer(d))  # settle: a last load by one caller
        assert w.messages == history[w.start :]
        for i in range(w.start):
            m = history[i]
            key = make_key(cid, i, fingerprint(m.role, m.text))
            assert hook.owner.get(key) == cid, f"{cid}[{i}] lost"


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_threads_loading_same_and_different_conversations(store: str, tmp_path: Path) -> None:
    hook = Ledger()
    state = SQLiteStateStore(tmp_path / "s.db") if store == "sqlite" else None
    d = Demoter(SlidingWindow.last_messages(6), hook, state=state)
    chats = Chats()
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        rng = random.Random(n)
        try:
            barrier.wait(5)
            for _ in range(40):
                cid = CIDS[0] if rng.random() < 0.5 else rng.choice(CIDS)  # one hot conversation
                snapshot = chats.append_and_snapshot(cid, rng.randint(0, 2))
                w = d.load(cid, snapshot, describer(d))
                assert w.messages == snapshot[w.start :]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    check(d, hook, chats)
    if state is not None:
        state.close()


async def test_many_tasks_loading_same_and_different_conversations() -> None:
    hook = Ledger()
    d = Demoter(SlidingWindow.last_messages(6), hook)
    chats = Chats()

    async def task(n: int) -> None:
        rng = random.Random(n)
        for _ in range(5):
            cid = CIDS[n % 2] if rng.random() < 0.5 else rng.choice(CIDS)
            snapshot = chats.append_and_snapshot(cid, rng.randint(0, 2))
            w = await d.aload(cid, snapshot, describer(d))
            assert w.messages == snapshot[w.start :]
            await asyncio.sleep(0)

    await asyncio.gather(*(task(n) for n in range(120)))
    check(d, hook, chats)


async def test_tasks_and_threads_together() -> None:
    hook = Ledger()
    d = Demoter(SlidingWindow.last_turns(2), hook)
    chats = Chats()

    def sync_worker(n: int) -> None:
        for _ in range(20):
            cid = CIDS[n % len(CIDS)]
            d.load(cid, chats.append_and_snapshot(cid, 1), describer(d))

    async def task(n: int) -> None:
        for _ in range(3):
            cid = CIDS[n % len(CIDS)]
            await d.aload(cid, chats.append_and_snapshot(cid, 1), describer(d))

    await asyncio.gather(
        *(asyncio.to_thread(sync_worker, n) for n in range(8)), *(task(n) for n in range(100))
    )
    check(d, hook, chats)


def test_stale_shorter_snapshot_is_not_a_rewrite() -> None:
    class Plain:
        def __init__(self) -> None:
            self.count: Counter[int] = Counter()

        def deliver(self, batch: Demotion) -> None:
            self.count.update(m.index for m in batch.messages)

    hook = Plain()
    d = Demoter(SlidingWindow.last_messages(4), hook)
    chats = Chats()
    stale = chats.append_and_snapshot(CIDS[0], 8)  # read by a slow request
    fresh = chats.append_and_snapshot(CIDS[0], 6)  # a faster request appended and loaded
    assert d.load(CIDS[0], fresh, describer(d)).start == 10
    d.load(CIDS[0], stale, describer(d))
    assert max(hook.count.values()) == 1
    assert d.state_of(CIDS[0]).window_start == 10


def test_stale_snapshot_behind_a_moved_window_is_recognised() -> None:
    """The view has moved on since the snapshot was read: its tail of left fingerprints
    still recognises it, and the snapshot gets its own window with nothing committed."""
    delivered: Counter[int] = Counter()

    class Plain:
        def deliver(self, batch: Demotion) -> None:
            delivered.update(m.index for m in batch.messages)

    d = Demoter(SlidingWindow.last_messages(4), Plain())
    chats = Chats()
    stale = chats.append_and_snapshot(CIDS[0], 6)
    for _ in range(5):  # the window moves on, load by load
        fresh = chats.append_and_snapshot(CIDS[0], 2)
        d.load(CIDS[0], fresh, describer(d))
    before = d.state_of(CIDS[0])
    assert before.window_start > len(stale)
    window = d.load(CIDS[0], stale, describer(d))
    assert [m for m in window.messages] == stale[-4:]
    assert d.state_of(CIDS[0]) == before
    assert max(delivered.values()) == 1
