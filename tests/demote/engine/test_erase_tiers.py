"""Demoter.erase end to end through real tiers: a Recorder with a SQLite outbox in front of
a sink, and mem0 (a real offline ``Memory``, configured as in test_mem0) behind a
FanOutHook. After the erase the conversation's secret is in no outbox file (raw bytes of
the main file and the WAL) and no mem0 answer, while a second conversation is untouched."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from demote import (
    AsyncRecorder,
    CallbackHook,
    Demoter,
    Demotion,
    FanOutHook,
    InMemoryStateStore,
    Recorder,
    SlidingWindow,
    SQLiteOutbox,
)
from demote.capture import RecorderStats, RetryPolicy
from demote.erase import TierReport
from demote.mem0 import Mem0Hook, Mem0Recall
from tests.demote.capture.test_capture_erase import leaks
from tests.demote.mem0 import test_mem0
from tests.demote.mem0.test_mem0 import SlowExtractor, stored
from tests.strategies import Msg, describer

# test_mem0's fixtures: the offline mem0, and the guard that fails a test reaching the network.
mem0_module = test_mem0.mem0_module
make_memory = test_mem0.make_memory
network_attempts = test_mem0.network_attempts

LAST2 = SlidingWindow.last_messages(2)
SECRET, KEPT = "vault-5531-qzx", "orchid-8812-wpl"


def chat(cid: str, word: str, n: int) -> list[Msg]:
    return [
        Msg("user" if i % 2 == 0 else "assistant", f"{cid} turn {i}: {word} number {i}")
        for i in range(n)
    ]


def grow(demoter: Demoter, cid: str, messages: list[Msg]) -> None:
    """Load the conversation as it grows, two messages a turn (each load demotes a batch)."""
    for end in range(2, len(messages) + 1, 2):
        demoter.load(cid, messages[:end], describer(demoter))


class Shelf:
    """A long-tail sink standing in for an archive: keeps batches, erases by conversation.

    It blocks on the batch whose text contains ``block`` until released, and fails every
    attempt at one containing ``poison`` (which the outbox then dead-letters).
    """

    def __init__(self, block: str = "", poison: str = "") -> None:
        self.batches: list[Demotion] = []
        self.block, self.poison = block, poison
        self.release, self.entered = threading.Event(), threading.Event()
        self.lock = threading.Lock()

    def deliver(self, batch: Demotion) -> None:
        text = " ".join(m.text for m in batch.messages)
        if self.poison and self.poison in text:
            raise RuntimeError("sink refuses this batch")
        if self.block and self.block in text:
            self.entered.set()
            assert self.release.wait(10)
        with self.lock:
            self.batches.append(batch)

    def erase(self, conversation_id: str, **_: Any) -> int:
        with self.lock:
            mine = [b for b in self.batches if b.conversation_id == conversation_id]
            self.batches = [b for b in self.batches if b.conversation_id != conversation_id]
        return sum(len(b.messages) for b in mine)

    def texts(self, cid: str) -> str:
        return " ".join(
            m.text for b in self.batches if b.conversation_id == cid for m in b.messages
        )


def test_erase_reaches_every_tier_and_no_file_keeps_the_secret(
    make_memory: Callable[..., Any], tmp_path: Path
) -> None:
    memory = make_memory()
    db = tmp_path / "outbox.db"
    outbox = SQLiteOutbox(db, retry=RetryPolicy(max_attempts=1, base_delay=0, max_delay=0))
    # c's first batch is dead-lettered, its second blocks in the sink, the rest queue up.
    shelf = Shelf(block="c turn 2:", poison="c turn 0:")
    recorder = Recorder(shelf, outbox=outbox)
    # Each load waits for its batch (mem0 may take longer than hook_wait): the test counts
    # what every tier holds right after the loads.
    hook = FanOutHook(recorder, Mem0Hook(memory, user_id="alice"))
    demoter = Demoter(LAST2, hook, hook_wait=None)
    c, o = chat("c", SECRET, 16), chat("o", KEPT, 16)
    grow(demoter, "c", c)
    grow(demoter, "o", o)
    assert shelf.entered.wait(5) and len(outbox.dead_letters()) == 1
    assert leaks(db, SECRET) and len(stored(memory, "c")) == 14
    recall = Mem0Recall(memory, user_id="alice")
    assert SECRET in recall.search("c", f"{SECRET} number", k=3)[0].text

    threading.Timer(0.3, shelf.release.set).start()  # the batch in the sink ends meanwhile
    report = demoter.erase("c", messages=c, describe=describer(demoter))

    assert report.tiers == (
        TierReport("FanOutHook[0].Recorder", "erased", 7),  # 6 queued + 1 dead letter
        TierReport("FanOutHook[0].Recorder[0].Shelf", "erased", 2),  # the one in flight
        TierReport("FanOutHook[1].Mem0Hook", "erased", 14),
    )
    assert report.complete
    recorder.close()
    assert SECRET not in shelf.texts("c") and shelf.texts("c") == ""
    assert leaks(db, SECRET) == []
    assert stored(memory, "c") == [] and recall.search("c", f"{SECRET} number") == []
    all_alice = memory.get_all(filters={"user_id": "alice"}, top_k=1000)["results"]
    assert not any(SECRET in r["memory"] for r in all_alice)
    # The other conversation is untouched, everywhere.
    assert shelf.texts("o").count(KEPT) == 14 and len(stored(memory, "o")) == 14
    assert KEPT in recall.search("o", f"{KEPT} number", k=3)[0].text
    assert demoter.state_of("o").delivered == 14 and demoter.state.get("c") is None
    outbox.close()
    assert leaks(db, SECRET) == [] and leaks(db, KEPT) == []  # delivered: acked, bytes too


def test_erase_racing_the_recorder_worker_leaves_nothing_in_mem0(
    make_memory: Callable[..., Any], tmp_path: Path
) -> None:
    memory = make_memory()
    facts = {SECRET: f"The vault code is {SECRET}", KEPT: f"The orchid code is {KEPT}"}
    memory.llm = SlowExtractor(facts, delay=0.3)
    db = tmp_path / "outbox.db"
    outbox = SQLiteOutbox(db)
    # mem0 off the request path: its slow extraction runs on the Recorder's worker.
    recorder = Recorder(Mem0Hook(memory, infer=True), outbox=outbox)
    demoter = Demoter(LAST2, recorder)
    grow(demoter, "o", chat("o", KEPT, 4))  # one batch
    grow(demoter, "c", chat("c", SECRET, 8))  # three batches
    deadline = time.monotonic() + 10
    while len(memory.llm.prompts) < 2:  # c's first batch is being extracted right now
        assert time.monotonic() < deadline
        time.sleep(0.01)
    report = demoter.erase("c")
    assert report.tiers == (
        TierReport("Recorder", "erased", 3),  # every row of c: the one in flight too
        TierReport("Recorder[0].Mem0Hook", "erased", 1),  # what the one in flight wrote
    )
    recorder.close()
    assert len(memory.llm.prompts) == 2, "c's queued batches never reached mem0"
    assert recorder.stats == RecorderStats(queued=4, delivered=2, erased=2)
    assert stored(memory, "c") == [] and leaks(db, SECRET) == []
    assert [r["memory"] for r in stored(memory, "o")] == [facts[KEPT]]
    assert demoter.state_of("o").delivered == 2 and demoter.state.get("c") is None
    outbox.close()


async def test_aerase_through_an_async_recorder(
    make_memory: Callable[..., Any], tmp_path: Path
) -> None:
    memory = make_memory()
    db = tmp_path / "outbox.db"
    with SQLiteOutbox(db) as outbox:
        async with AsyncRecorder(Mem0Hook(memory), outbox=outbox) as recorder:
            demoter = Demoter(LAST2, recorder)
            for cid, word in (("c", SECRET), ("o", KEPT)):
                messages = chat(cid, word, 10)
                for end in range(2, 11, 2):
                    await demoter.aload(cid, messages[:end], describer(demoter))
            report = await demoter.aerase("c")
            assert report.complete and [t.tier for t in report.tiers] == [
                "AsyncRecorder",
                "AsyncRecorder[0].Mem0Hook",
            ]
        assert stored(memory, "c") == [] and len(stored(memory, "o")) == 8
        assert leaks(db, SECRET) == []


def test_a_late_batch_from_a_worker_the_erase_took_over_from_is_fenced_out(
    tmp_path: Path,
) -> None:
    store = InMemoryStateStore()
    db = tmp_path / "outbox.db"
    outbox = SQLiteOutbox(db)
    shelf = Shelf()
    recorder = Recorder(shelf, outbox=outbox)
    gate, entered = threading.Event(), threading.Event()

    def slow(batch: Demotion) -> None:  # a hook before the Recorder, hanging for a while
        entered.set()
        assert gate.wait(10)

    worker = Demoter(LAST2, FanOutHook(CallbackHook(slow), recorder), state=store)
    admin = Demoter(LAST2, FanOutHook(CallbackHook(slow), recorder), state=store)
    c = chat("c", SECRET, 10)
    thread = threading.Thread(target=lambda: worker.load("c", c, describer(worker)))
    thread.start()
    assert entered.wait(5)
    report = admin.erase("c", wait=0.1)  # the worker does not finish in time
    assert report.took_over
    gate.set()  # its batch reaches the Recorder under the revoked, older token
    thread.join(5)
    recorder.close()
    assert (worker.stats().last_error or "").startswith("FencedOut")
    assert shelf.texts("c") == "" and outbox.pending() == 0
    assert leaks(db, SECRET) == [] and store.get("c") is None
    outbox.close()
