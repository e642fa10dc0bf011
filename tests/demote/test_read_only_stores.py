"""Stores opened read-only (what ``demote inspect`` does): they read, and never write.

Each store is filled read-write first, closed, then reopened with ``read_only=True``: the
reads agree with the read-write store's, every write is a StoreError, and the file is
byte-for-byte what it was; a missing file is not created, and a file this version would
have to migrate is refused instead of being migrated.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from demote import ConversationState, Demoter, SlidingWindow, SQLiteOutbox, SQLiteStateStore
from demote.capture import RetryPolicy
from demote.cli.app import main
from demote.errors import ArgumentTypeError, StoreError
from tests.strategies import Msg, describer


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file with content; not ``-shm``, SQLite's shared-memory index, which any
    reader of a WAL file maps (and a read-only one may have to create)."""
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if p.stat().st_size and not p.name.endswith("-shm")
    }


def filled_state(path: Path) -> ConversationState:
    state = SQLiteStateStore(path)
    d = Demoter(SlidingWindow.last_messages(2), state=state)
    d.load("A", [Msg("user", f"m{i}") for i in range(6)], describer(d))
    d.close()
    stored = state.get("A")
    state.close()
    assert stored is not None and stored.window_start > 0
    return stored


def test_a_read_only_state_store_reads_and_refuses_every_write(tmp_path: Path) -> None:
    stored = filled_state(tmp_path / "state.db")
    before = snapshot(tmp_path)
    with SQLiteStateStore(tmp_path / "state.db", read_only=True) as ro:
        assert ro.get("A") == stored and ro.get("B") is None
        assert ro.conversations() == ["A"] and ro.count() == 1
        writes = [
            lambda: ro.compare_and_set("A", stored, ConversationState(window_start=1)),
            lambda: ro.clear("A"),
            lambda: ro.delete("A"),
            lambda: ro.acquire_lease("A", "me", 30),
        ]
        for write in writes:
            with pytest.raises(StoreError, match="read-only"):
                write()
        assert ro.get("A") == stored
    assert snapshot(tmp_path) == before


def test_a_read_only_state_store_neither_creates_nor_migrates(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        SQLiteStateStore(tmp_path / "missing.db", read_only=True)
    assert not (tmp_path / "missing.db").exists()
    filled_state(tmp_path / "old.db")
    with sqlite3.connect(tmp_path / "old.db") as db:
        db.execute("PRAGMA user_version = 2")  # as an older demote left it
    db.close()
    before = snapshot(tmp_path)
    with pytest.raises(StoreError, match="schema"):
        SQLiteStateStore(tmp_path / "old.db", read_only=True)
    assert snapshot(tmp_path) == before
    with pytest.raises(ArgumentTypeError, match="read_only"):
        SQLiteStateStore(tmp_path / "old.db", read_only="yes")  # type: ignore[arg-type]


def filled_outbox(path: Path) -> None:
    box = SQLiteOutbox(path, retry=RetryPolicy(max_attempts=1, base_delay=0, max_delay=0))
    box.put("k1", '"queued"', conversation="A")
    dead = box.put("k2", '"refused"', conversation="A")
    box.bury(dead, 1, "sink said no")
    box.close()


def test_a_read_only_outbox_reads_and_refuses_writes(tmp_path: Path) -> None:
    filled_outbox(tmp_path / "outbox.db")
    with SQLiteOutbox(tmp_path / "outbox.db") as rw:
        pending, rows, letters = rw.pending(), rw.load(), rw.dead_letters()
    assert pending == 1 and len(letters) == 1
    before = snapshot(tmp_path)
    with SQLiteOutbox(tmp_path / "outbox.db", read_only=True) as ro:
        assert (ro.pending(), ro.load(), ro.dead_letters()) == (pending, rows, letters)
        with pytest.raises(StoreError):
            ro.put("k3", '"new"', conversation="A")
        with pytest.raises(StoreError):
            ro.erase("A")
        assert ro.pending() == 1
    assert snapshot(tmp_path) == before


def test_a_read_only_outbox_refuses_what_is_not_an_outbox_yet(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        SQLiteOutbox(tmp_path / "missing.db", read_only=True)
    assert not (tmp_path / "missing.db").exists()
    sqlite3.connect(tmp_path / "empty.db").close()  # an empty SQLite file: not yet claimed
    with pytest.raises(StoreError, match="not an outbox"):
        SQLiteOutbox(tmp_path / "empty.db", read_only=True)
    assert (tmp_path / "empty.db").read_bytes() == b""


def test_inspect_refuses_a_state_file_it_would_have_to_migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    filled_state(tmp_path / "state.db")
    with sqlite3.connect(tmp_path / "state.db") as db:
        db.execute("PRAGMA user_version = 2")
    db.close()
    before = snapshot(tmp_path)
    assert main(["inspect", "--state", str(tmp_path / "state.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "schema" in err
    assert snapshot(tmp_path) == before
