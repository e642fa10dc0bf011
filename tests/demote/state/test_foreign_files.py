"""Touch only what is demote's: a file that is not a store's own is refused, unchanged.

Every SQLite store (state, archive, outbox) is opened on files that are not its own: a
``demote_state`` (or ``messages``, ``outbox``) table with other columns, another program's
database (rollback journal and WAL), another component's file, an empty file, a text file.
Each gets :class:`StoreError` naming the file, and the file stays byte-for-byte as it was,
with no ``-wal`` or ``-shm`` beside it. The services' stores do the same for a PostgreSQL
table named like demote's with other columns and a Redis key of another type.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from demote import ConversationState, SQLiteArchive, SQLiteStateStore, StoreError
from demote.capture.outbox import SQLiteOutbox


def _state(path: Path) -> Any:
    return SQLiteStateStore(path)


def _archive(path: Path) -> Any:
    return SQLiteArchive(path)


def _outbox(path: Path) -> Any:
    return SQLiteOutbox(path)


STORES: dict[str, Callable[[Path], Any]] = {
    "state": _state,
    "archive": _archive,
    "outbox": _outbox,
}


def _sqlite(path: Path, *statements: str, wal: bool = False) -> None:
    db = sqlite3.connect(path)
    if wal:
        db.execute("PRAGMA journal_mode=WAL")
    for statement in statements:
        db.execute(statement)
    db.commit()
    db.close()
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0


def _other_schema(path: Path, store: str) -> None:
    table = {"state": "demote_state", "archive": "messages", "outbox": "outbox"}[store]
    _sqlite(path, f"CREATE TABLE {table} (id TEXT PRIMARY KEY, blob BLOB)")
    db = sqlite3.connect(path)
    db.execute(f"INSERT INTO {table} VALUES ('x', X'00ff')")
    db.commit()
    db.close()


def _another_program(path: Path, store: str, wal: bool = False) -> None:
    _sqlite(
        path,
        "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)",
        "INSERT INTO invoices (total) VALUES (12.5)",
        wal=wal,
    )


def _another_program_wal(path: Path, store: str) -> None:
    _another_program(path, store, wal=True)


def _tagged(path: Path, store: str) -> None:
    _sqlite(path, "CREATE TABLE t (x)", "PRAGMA application_id = 1234")


def _other_component(path: Path, store: str) -> None:
    other = {"state": _archive, "archive": _outbox, "outbox": _state}[store]
    other(path).close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _empty(path: Path, store: str) -> None:
    path.write_bytes(b"")


def _text(path: Path, store: str) -> None:
    path.write_text("not a database, just some notes\n" * 10)


FILES: dict[str, Callable[[Path, str], None]] = {
    "demote-table-other-columns": _other_schema,
    "another-program": _another_program,
    "another-program-wal": _another_program_wal,
    "foreign-application-id": _tagged,
    "another-component": _other_component,
    "empty-file": _empty,
    "text-file": _text,
}


@pytest.mark.parametrize("store", list(STORES))
@pytest.mark.parametrize("make", list(FILES))
def test_a_foreign_file_is_refused_and_left_unchanged(
    store: str, make: str, tmp_path: Path
) -> None:
    path = tmp_path / "foreign.db"
    FILES[make](path, store)
    before = path.read_bytes()
    listing = sorted(os.listdir(tmp_path))
    with pytest.raises(StoreError) as info:
        STORES[store](path).close()
    assert str(path) in str(info.value), "the error names the file"
    assert path.read_bytes() == before, "byte-for-byte unchanged"
    assert sorted(os.listdir(tmp_path)) == listing, "no -wal or -shm beside it"


@pytest.mark.parametrize("store", list(STORES))
def test_a_new_file_and_the_stores_own_file_still_open(store: str, tmp_path: Path) -> None:
    path = tmp_path / "own.db"
    STORES[store](path).close()
    STORES[store](path).close()  # its own file, again


def test_a_state_file_of_an_older_schema_is_still_claimed(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    from demote.state.sqlite import _MIGRATIONS

    _sqlite(path, _MIGRATIONS[1].strip().rstrip(";"))
    store = SQLiteStateStore(path)
    assert store.compare_and_set("c", None, ConversationState(window_start=2, delivered=2))
    store.close()


def test_an_empty_file_being_created_by_another_opener_is_waited_for(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "racing.db"
    path.write_bytes(b"")

    def create() -> None:  # a concurrent opener writes its header a moment later
        SQLiteStateStore(tmp_path / "other.db").close()
        os.replace(tmp_path / "other.db", path)

    t = threading.Timer(0.1, create)
    t.start()
    SQLiteStateStore(path).close()
    t.join(5)


# -- the services ---------------------------------------------------------------------------


def test_postgres_refuses_a_state_table_with_other_columns(postgres_url: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from demote.state.postgres import PostgresStateStore

    table = f"sinkwait_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id TEXT PRIMARY KEY, payload JSONB)")
        conn.execute(f"INSERT INTO {table} VALUES ('x', '{{\"a\": 1}}')")
        try:
            with pytest.raises(StoreError, match=table):
                PostgresStateStore(postgres_url, table=table).close()
            rows = conn.execute(f"SELECT id, payload::text FROM {table}").fetchall()
            assert rows == [("x", '{"a": 1}')]
            cols = conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                "ORDER BY 1",
                (table,),
            ).fetchall()
            assert cols == [("id",), ("payload",)], "no column was added"
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"DROP TABLE IF EXISTS {table}_lease")
            conn.execute(f"DROP SEQUENCE IF EXISTS {table}_fence")


def test_redis_refuses_a_key_of_another_type_at_the_state_prefix(redis_url: str) -> None:
    redis = pytest.importorskip("redis")
    from demote.state.redis import RedisStateStore

    prefix = f"sinkwait-{uuid.uuid4().hex[:8]}:"
    client = redis.Redis.from_url(redis_url)
    try:
        store = RedisStateStore(redis_url, prefix=prefix)
        key = store._key("state", "c")  # where the store keeps conversation c
        client.rpush(key, "someone else's list")
        with pytest.raises(StoreError, match=r"WRONGTYPE|another type"):
            store.get("c")
        with pytest.raises(StoreError):
            store.compare_and_set("c", None, ConversationState(window_start=2))
        assert client.type(key) == b"list" and client.lrange(key, 0, -1) == [b"someone else's list"]
        store.close()
    finally:
        for k in client.scan_iter(f"{prefix}*"):
            client.delete(k)
        client.close()


def test_the_postgres_archive_refuses_a_table_of_another_program(postgres_url: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from demote import PostgresArchive

    table = f"sinkwait_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id TEXT PRIMARY KEY, body TEXT)")
        conn.execute(f"INSERT INTO {table} VALUES ('x', 'theirs')")
        try:
            with pytest.raises(StoreError, match=table):
                PostgresArchive(postgres_url, table=table).close()
            assert conn.execute(f"SELECT * FROM {table}").fetchall() == [("x", "theirs")]
            made = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE %s",
                (f"{table}_%",),
            ).fetchone()
            assert made == (0,), "no archive table was created beside it"
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
