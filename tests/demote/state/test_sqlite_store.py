"""SQLiteStateStore beyond the contract: files, schema versions, migration, bad rows."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from demote import ConversationState, DemoteError, SQLiteStateStore, StoreError
from demote.state.sqlite import APPLICATION_ID, SCHEMA_VERSION

S1 = ConversationState(window_start=4, delivered=4, pinned=1, anchor="ab" * 16)
S2 = ConversationState(window_start=9, delivered=7, summary="s", summarized=2, generation=3)

# The layout every release before schema versioning wrote (user_version 0).
V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS demote_state (
    conversation_id TEXT PRIMARY KEY, window_start INTEGER NOT NULL,
    delivered INTEGER NOT NULL, pinned INTEGER NOT NULL, anchor TEXT, summary TEXT,
    summarized INTEGER NOT NULL, offset INTEGER NOT NULL, generation INTEGER NOT NULL
)
"""


def write_v1(path: Path, rows: dict[str, ConversationState]) -> None:
    db = sqlite3.connect(path)
    db.execute(V1_SCHEMA)
    for cid, s in rows.items():
        db.execute(
            "INSERT INTO demote_state VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (cid, s.window_start, s.delivered, s.pinned, s.anchor, s.summary, s.summarized,
             s.offset, s.generation),
        )  # fmt: skip
    db.commit()
    db.close()


def pragmas(path: Path) -> tuple[int, int]:
    db = sqlite3.connect(path)
    try:
        return (
            db.execute("PRAGMA application_id").fetchone()[0],
            db.execute("PRAGMA user_version").fetchone()[0],
        )
    finally:
        db.close()


def test_a_file_of_the_previous_layout_migrates_and_keeps_its_states(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_v1(path, {"a": S1, "b": S2})
    with SQLiteStateStore(path) as store:
        assert store.get("a") == S1 and store.get("b") == S2 and store.count() == 2
        lease = store.acquire_lease("a", "w", 30)
        assert lease is not None and lease.token == 1 and lease.state == S1
        assert store.compare_and_set("a", S1, S2, lease=lease, release=True)
    assert pragmas(path) == (APPLICATION_ID, SCHEMA_VERSION)
    with SQLiteStateStore(path) as store:  # reopening is a no-op migration
        assert store.get("a") == S2 and store.conversations() == ["a", "b"]
        later = store.acquire_lease("b", "w", 30)
        assert later is not None and later.token == 2, "the fencing counter is durable"


def test_two_processes_opening_an_old_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_v1(path, {"a": S1})
    opened: list[SQLiteStateStore] = []
    barrier = threading.Barrier(4)

    def open_it() -> None:
        barrier.wait(10)
        opened.append(SQLiteStateStore(path))

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert len(opened) == 4 and all(s.get("a") == S1 for s in opened)
        tokens = [s.acquire_lease(f"c{i}", "w", 30) for i, s in enumerate(opened)]
        assert sorted(t.token for t in tokens if t) == [1, 2, 3, 4]
    finally:
        for s in opened:
            s.close()


def test_a_newer_schema_or_a_foreign_file_is_refused(tmp_path: Path) -> None:
    newer = tmp_path / "newer.db"
    SQLiteStateStore(newer).close()
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer"):
        SQLiteStateStore(newer)
    foreign = tmp_path / "foreign.db"
    db = sqlite3.connect(foreign)
    db.execute("PRAGMA application_id = 1234")
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a demote state store"):
        SQLiteStateStore(foreign)


def test_a_row_of_the_wrong_type_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SQLiteStateStore(path) as store:
        assert store.compare_and_set("a", None, S1)
    db = sqlite3.connect(path)
    db.execute("UPDATE demote_state SET window_start = 'four', anchor = 7")
    db.commit()
    db.close()
    with SQLiteStateStore(path) as store:
        for call in (
            lambda: store.get("a"),
            lambda: store.compare_and_set("a", S1, S2),
            lambda: store.acquire_lease("a", "w", 30),
        ):
            with pytest.raises(StoreError, match="corrupt"):
                call()
        assert store.clear("a") == ConversationState(generation=S1.generation + 1)


def test_persists_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SQLiteStateStore(path) as s:
        assert s.compare_and_set("a", None, S2)
        assert s.acquire_lease("a", "w", 30) is not None
    with SQLiteStateStore(path) as s:
        assert s.get("a") == S2 and s.count() == 1
        assert s.acquire_lease("a", "w2", 30) is None, "the lease is durable too"


def test_bad_path_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as info:
        SQLiteStateStore(tmp_path / "no" / "such" / "dir" / "s.db")
    assert isinstance(info.value, DemoteError) and "no" in str(info.value)
    (tmp_path / "adir").mkdir()
    with pytest.raises(StoreError):
        SQLiteStateStore(tmp_path / "adir")


def test_closed_store_is_a_store_error_sync_and_async(tmp_path: Path) -> None:
    s = SQLiteStateStore(tmp_path / "s.db")
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        s.get("a")
    with pytest.raises(StoreError, match="closed"):
        asyncio.run(s.aget("a"))


def test_async_twins_run_on_the_stores_own_thread(tmp_path: Path) -> None:
    seen: list[str] = []
    with SQLiteStateStore(tmp_path / "s.db") as s:
        real = s._read

        def spy(db: object, cid: str) -> ConversationState | None:
            seen.append(threading.current_thread().name)
            return real(db, cid)  # type: ignore[arg-type]

        s._read = spy  # type: ignore[method-assign]

        async def main() -> None:
            await asyncio.gather(*(s.aget("a") for _ in range(5)))

        asyncio.run(main())
    assert len(seen) == 5 and len(set(seen)) == 1
    assert seen[0].startswith("demote-sqlite-state"), seen


def test_a_deleted_state_leaves_no_bytes_in_the_file_or_the_wal(tmp_path: Path) -> None:
    from tests.demote.capture.test_capture_erase import leaks

    path = tmp_path / "state.db"
    secret = "quokka7741summary"
    with SQLiteStateStore(path) as store, SQLiteStateStore(path) as other:
        summary = ConversationState(window_start=4, delivered=4, summary=f"code {secret}")
        assert store.compare_and_set("tenant-9931", None, summary)
        assert other.compare_and_set("kept", None, S2)
        assert leaks(path, secret) and leaks(path, "tenant-9931")
        store.delete("tenant-9931")
        assert leaks(path, secret) == [] and leaks(path, "tenant-9931") == []
        assert (tmp_path / "state.db-wal").stat().st_size == 0
        assert other.get("kept") == S2 and other.get("tenant-9931") is None


async def test_adelete_truncates_the_wal_too(tmp_path: Path) -> None:
    from tests.demote.capture.test_capture_erase import leaks

    path = tmp_path / "state.db"
    with SQLiteStateStore(path) as store:
        await store.acompare_and_set("c", None, ConversationState(summary="zebra5522secret"))
        await store.adelete("c")
        assert leaks(path, "zebra5522secret") == []
