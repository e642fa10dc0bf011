"""An erase racing a delivery in flight leaves no delivered row behind.

In one process (threads sharing a Demoter, or two Demoters on one state store) and across
processes (a worker process delivering through a shared SQLite or Redis state store into
a shared SQLite archive file): the erase either waits for the delivery and deletes what it
wrote, or, when the delivery outlives ``wait``, takes the conversation over with a newer
fencing token, and the archive (and a vector store in the same process) refuse the late
batch with ``FencedOut``. Either way nothing of the erased conversation stays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore

from demote import Demoter, Demotion, FanOutHook, InMemoryStateStore, SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from demote.state import RedisStateStore, SQLiteStateStore
from langchain_demote import VectorStoreHook
from tests.demote.capture.test_capture_erase import leaks, wait_for
from tests.strategies import Msg, describer
from tests.support.erase_worker import SECRET

LAST2 = SlidingWindow.last_messages(2)
ROOT = Path(__file__).resolve().parents[3]  # the project: ``-m tests.support...`` runs there


class GatedArchive(SQLiteArchive):
    """Holds each batch (before storing it) until the gate opens."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate, self.entered = threading.Event(), threading.Event()

    def deliver(self, batch: Demotion) -> None:
        self.entered.set()
        assert self.gate.wait(10)
        super().deliver(batch)


def chat(cid: str, n: int = 10) -> list[Msg]:
    return [Msg(("user", "assistant")[i % 2], f"{cid} turn {i}: {SECRET}") for i in range(n)]


def vector_texts(store: InMemoryVectorStore, cid: str) -> list[str]:
    return [d["text"] for d in store.store.values() if d["metadata"]["conversation_id"] == cid]


def test_an_erase_in_the_same_process_waits_for_the_delivery_then_deletes_it(
    tmp_path: Path,
) -> None:
    archive = GatedArchive(tmp_path / "archive.db")
    vectors = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))
    demoter = Demoter(LAST2, FanOutHook(archive, VectorStoreHook(vectors)))
    worker = threading.Thread(target=lambda: demoter.load("c", chat("c"), describer(demoter)))
    worker.start()
    assert archive.entered.wait(5)
    threading.Timer(0.3, archive.gate.set).start()  # the delivery ends while erase waits
    report = demoter.erase("c")
    worker.join(5)
    assert report.complete and not report.took_over
    assert [t.removed for t in report.tiers] == [8, 8], "it erased what the delivery wrote"
    assert archive.count("c") == 0 and vector_texts(vectors, "c") == []
    assert leaks(tmp_path / "archive.db", SECRET) == []
    archive.close()


def test_a_delivery_that_outlives_the_wait_is_refused_by_every_fencing_tier(
    tmp_path: Path,
) -> None:
    store = InMemoryStateStore()
    archive = GatedArchive(tmp_path / "archive.db")
    vectors = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))
    hook = FanOutHook(VectorStoreHook(vectors), archive)  # the vector store first: it lands
    worker = Demoter(LAST2, hook, state=store)
    admin = Demoter(LAST2, hook, state=store)
    thread = threading.Thread(target=lambda: worker.load("c", chat("c"), describer(worker)))
    thread.start()
    assert archive.entered.wait(5)
    report = admin.erase("c", wait=0.1)  # the worker is still inside the archive
    assert report.took_over and not report.complete
    archive.gate.set()  # its late batch reaches the archive under the revoked token
    thread.join(5)
    assert (worker.stats().last_error or "").startswith("FencedOut")
    assert archive.count("c") == 0 and leaks(tmp_path / "archive.db", SECRET) == []
    assert vector_texts(vectors, "c") == [], "refused: its fence predates the erase"
    assert store.get("c") is None, "and its commit refused with its revoked lease"
    archive.close()


async def test_aerase_waits_for_an_async_delivery(tmp_path: Path) -> None:
    import asyncio

    archive = GatedArchive(tmp_path / "archive.db")
    demoter = Demoter(LAST2, archive)
    load = asyncio.create_task(demoter.aload("c", chat("c"), describer(demoter)))
    await asyncio.to_thread(archive.entered.wait, 5)
    asyncio.get_running_loop().call_later(0.3, archive.gate.set)
    report = await demoter.aerase("c")
    await load
    assert report.complete and archive.count("c") == 0
    archive.close()


# -- across processes -------------------------------------------------------------------


def stores() -> list[Any]:
    reason = "DEMOTE_TEST_REDIS_URL not set: redis tests need a running redis (.ci/run sets it)"
    no_redis = pytest.mark.skipif(not os.environ.get("DEMOTE_TEST_REDIS_URL"), reason=reason)
    return ["sqlite", pytest.param("redis", marks=no_redis)]


def open_state(kind: str, tmp_path: Path, prefix: str) -> tuple[Any, str]:
    if kind == "sqlite":
        target = str(tmp_path / "state.db")
        return SQLiteStateStore(target), target
    target = os.environ["DEMOTE_TEST_REDIS_URL"]
    return RedisStateStore(target, prefix=prefix), target


@pytest.mark.parametrize("kind", stores())
@pytest.mark.parametrize("wait", [30.0, 0.2], ids=["waits", "takes-over"])
def test_an_erase_racing_another_process_leaves_no_delivered_row(
    kind: str, wait: float, tmp_path: Path
) -> None:
    prefix = f"demote-erase-{uuid.uuid4().hex[:8]}:"
    state, target = open_state(kind, tmp_path, prefix)
    archive_path, ready = tmp_path / "archive.db", tmp_path / "ready"
    SQLiteArchive(archive_path).close()  # created (and migrated) before the race
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.support.erase_worker", kind, target, prefix,
         str(archive_path), "c", "1.5", str(ready)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # The worker holds the lease, inside the archive (or died: say why, at once).
        wait_for(lambda: ready.exists() or worker.poll() is not None, timeout=60)
        assert ready.exists(), f"the worker exited {worker.returncode}: {worker.communicate()}"
        with SQLiteArchive(archive_path) as archive:
            admin = Demoter(LAST2, archive, state=state)
            began = time.monotonic()
            report = admin.erase("c", wait=wait)
            out, err = worker.communicate(timeout=60)
            assert worker.returncode == 0, err
            outcome = json.loads(out)
            if wait > 1:  # it waited for the delivery, then deleted what it wrote
                assert not report.took_over and report.complete
                assert time.monotonic() - began > 0.5 and report.tiers[0].removed == 8
                assert outcome == {"pending": 0, "error": None}
            else:  # it took over: the late batch was refused, in the other process
                assert report.took_over and report.tiers[0].removed == 0
                assert outcome["pending"] == 8 and outcome["error"].startswith("FencedOut")
            assert archive.count("c") == 0 and archive.messages("c") == []
            assert state.get("c") is None
            admin.close()
        assert leaks(archive_path, SECRET) == []
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
        state.close()
