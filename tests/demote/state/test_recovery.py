"""Recovery without a restart: once the cause is gone, the first load succeeds.

Real faults on real files: a full disk (a 512 KiB tmpfs this test mounts, filled and then
freed; skipped with the reason when mounting is not permitted) and a locked file (another
connection holding ``BEGIN EXCLUSIVE``, then releasing it), for sync and async loads, on
the SQLite state store and archive, with both ``on_store_error`` settings. While the
fault lasts, a load raises a typed :class:`StoreError` (``"raise"``) or returns a degraded
window (``"degrade"``, the default); once the cause is gone and the store's breaker is past
its probe interval (at most 0.6 s), the next load succeeds, commits, and what was pending
reaches the archive exactly once.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from demote import Demoter, SlidingWindow, SQLiteArchive, SQLiteStateStore, StoreError
from demote.backends.breaker import breaker_of
from tests.strategies import Msg, describer, unique


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(directory: Path) -> Path:
    """Take every free byte of the file system; returns the filler to remove."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def _turns(start: int, n: int) -> list[Msg]:
    out: list[Msg] = []
    for i in range(start, start + n):
        out += [Msg("user", f"question {i} " + "q" * 300), Msg("assistant", f"answer {i}")]
    return unique(out)


async def _load(d: Demoter, cid: str, history: list[Msg], mode: str) -> object:
    if mode == "async":
        return await d.aload(cid, history, describer(d))
    return d.load(cid, history, describer(d))


async def _faulted(d: Demoter, cid: str, history: list[Msg], mode: str) -> bool:
    """Load during a fault: did the store fail it (raised, or a degraded window)?"""
    try:
        w = await _load(d, cid, history, mode)
    except StoreError:
        assert d.on_store_error == "raise", "a degrading demoter let a store error out"
        return True
    return bool(w.degraded)  # type: ignore[attr-defined]


async def _past_probe(d: Demoter, mode: str = "sync") -> None:
    """Wait out the state store's breaker, so the next load reaches the store.

    The loads the fault left pending are retried in the background, and one of those may
    be the breaker's probe when the next load comes (which then fails fast, as a call
    during a probe does): they are waited for too.
    """
    await asyncio.sleep(breaker_of(d.state).retry_in())
    if mode == "async":
        await d.adrain(10)
    else:
        d.drain(10)


@pytest.mark.parametrize("on_error", ["degrade", "raise"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_full_disk_then_space_back_the_next_load_succeeds(
    small_disk: Path, mode: str, on_error: str
) -> None:
    archive = SQLiteArchive(small_disk / "archive.db")
    d = Demoter(
        SlidingWindow.last_messages(2),
        archive,
        state=SQLiteStateStore(small_disk / "s.db"),
        on_store_error=on_error,  # type: ignore[arg-type]
    )
    history = _turns(0, 3)
    await _load(d, "c", history, mode)
    filler = _fill(small_disk)
    failed = 0
    for i in range(3, 40):  # long enough to run the disk out inside the store's writes
        history += _turns(i, 1)
        failed += await _faulted(d, "c", history, mode)
    assert failed > 0, "the full disk was a real fault for the store"
    filler.unlink()
    await _past_probe(d, mode)
    history += _turns(40, 1)
    w = await _load(d, "c", history, mode)  # the first load after space is back
    assert d.state_of("c").window_start == w.start == len(history) - 2  # type: ignore[attr-defined]
    assert d.drain(10)
    w = await _load(d, "c", history, mode)
    assert w.pending == 0  # type: ignore[attr-defined]
    assert archive.count("c") == len(history) - 2, "everything pending reached the archive once"
    d.close()
    archive.close()


@pytest.mark.parametrize("on_error", ["degrade", "raise"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_locked_state_file_then_released_the_next_load_succeeds(
    tmp_path: Path, mode: str, on_error: str
) -> None:
    path = tmp_path / "s.db"
    d = Demoter(
        SlidingWindow.last_messages(2),
        state=SQLiteStateStore(path, timeout=0.1),
        on_store_error=on_error,  # type: ignore[arg-type]
    )
    history = _turns(0, 3)
    await _load(d, "c", history, mode)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    other.execute("BEGIN EXCLUSIVE")
    for i in range(3, 6):
        history += _turns(i, 1)
        assert await _faulted(d, "c", history, mode), "the lock was a real fault for the store"
    other.execute("ROLLBACK")
    other.close()
    await _past_probe(d, mode)
    w = await _load(d, "c", history, mode)
    assert d.state_of("c").window_start == w.start == len(history) - 2  # type: ignore[attr-defined]


async def test_a_locked_archive_then_released_delivers_what_was_pending(tmp_path: Path) -> None:
    path = tmp_path / "archive.db"
    archive = SQLiteArchive(path, timeout=0.1)
    d = Demoter(SlidingWindow.last_messages(2), archive)
    history = _turns(0, 3)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    other.execute("BEGIN EXCLUSIVE")
    w = d.load("c", history, describer(d))
    assert w.pending == 4, "the locked archive refused the batch"
    other.execute("ROLLBACK")
    other.close()
    d2 = Demoter(SlidingWindow.last_messages(2), archive, state=d.state)  # no backoff
    w = await d2.aload("c", history, describer(d2))
    assert (w.pending, archive.count("c")) == (0, 4)
    await asyncio.sleep(0)
    archive.close()
