"""``demote migrate``: every table made or upgraded ahead of a deployment, idempotently.

On SQLite files and PostgreSQL tables: a first run creates the schema (and says what it
made), a second makes nothing, a dropped table is made again, an older file is upgraded,
a newer schema is refused and left as it was. On Redis there is nothing to do, and it
says so. The stores it made open read-only at once (what ``demote inspect`` needs).
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from demote import SQLiteStateStore
from demote.archive.postgres import PostgresArchive
from demote.archive.sqlite import SQLiteArchive
from demote.capture import SQLiteOutbox
from demote.cli import main
from demote.state import PostgresStateStore
from tests.demote.archive.pg import drop_archive
from tests.demote.state.conftest import drop_pg_tables


def migrate(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["migrate", *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


def test_sqlite_files_are_created_then_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--state", str(tmp_path / "s.db"), "--archive", str(tmp_path / "a.db"),
            "--outbox", str(tmp_path / "o.db")]  # fmt: skip
    first = migrate(args, capsys)
    assert first[0] == f"state:   {tmp_path / 's.db'} (SQLite file): created at schema 4"
    assert "table demote_state" in first[1] and "table demote_fence" in first[1]
    assert first[2].endswith("(SQLite file): created at schema 5")
    assert "table messages" in first[3] and "table messages_fts" in first[3]
    assert first[4].endswith("(SQLite file): created") and "table dead_letters" in first[5]
    # Ready for the read-only opens of demote inspect and search.
    SQLiteStateStore(tmp_path / "s.db", read_only=True).close()
    SQLiteArchive(tmp_path / "a.db", read_only=True).close()
    SQLiteOutbox(tmp_path / "o.db", read_only=True).close()
    again = migrate(args, capsys)
    assert [line.rsplit(": ", 1)[1] for line in again] == [
        "up to date at schema 4, nothing made",
        "up to date at schema 5, nothing made",
        "up to date, nothing made",
    ]


def test_a_dropped_sqlite_table_is_made_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.db"
    SQLiteStateStore(path).close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE demote_lease")
    db.commit()
    db.close()
    out = migrate(["--state", str(path)], capsys)
    assert out[0].endswith("made again what was missing at schema 4")
    assert out[1].strip() == "made: table demote_lease"


def test_an_older_sqlite_state_file_is_upgraded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.db"
    db = sqlite3.connect(path)  # a file of the first release: demote_state alone
    db.execute(
        "CREATE TABLE demote_state (conversation_id TEXT PRIMARY KEY, window_start INTEGER "
        "NOT NULL, delivered INTEGER NOT NULL, pinned INTEGER NOT NULL, anchor TEXT, summary "
        "TEXT, summarized INTEGER NOT NULL, offset INTEGER NOT NULL, generation INTEGER "
        "NOT NULL)"
    )
    db.execute("INSERT INTO demote_state VALUES ('c', 4, 4, 0, NULL, NULL, 0, 0, 1)")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    out = migrate(["--state", str(path)], capsys)
    assert out[0].endswith("upgraded from schema 1 to 4")
    with SQLiteStateStore(path, read_only=True) as store:
        state = store.get("c")
        assert state is not None and state.window_start == 4


@pytest.fixture
def tables(postgres_url: str) -> Iterator[tuple[str, str]]:
    state, archive = f"s_{uuid.uuid4().hex[:12]}", f"a_{uuid.uuid4().hex[:12]}"
    yield state, archive
    drop_pg_tables(postgres_url, state)
    drop_archive(postgres_url, archive)


def test_postgres_tables_are_created_made_again_and_a_newer_schema_refused(
    postgres_url: str, tables: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, archive = tables
    args = ["--state", postgres_url, "--state-table", state, "--archive", postgres_url,
            "--archive-table", archive]  # fmt: skip
    first = migrate(args, capsys)
    assert first[0] == f"state:   {postgres_url} (table {state}): created at schema 4"
    for made in (f"table {state}", f"table {state}_lease", f"sequence {state}_fence",
                 f"table {state}_meta"):  # fmt: skip
        assert made in first[1]
    assert first[2].endswith(f"(table {archive}): created at schema 2")
    for made in (f"table {archive}", f"table {archive}_vectors", f"index {archive}_tsv",
                 f"text search configuration {archive}_fts"):  # fmt: skip
        assert made in first[3]
    PostgresStateStore(postgres_url, table=state, read_only=True).close()
    PostgresArchive(postgres_url, table=archive, read_only=True).close()
    assert [line.rsplit(": ", 1)[1] for line in migrate(args, capsys)] == [
        "up to date at schema 4, nothing made",
        "up to date at schema 2, nothing made",
    ]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {state}")
        conn.execute(f"DROP TABLE {archive}_erased")
    again = migrate(args, capsys)
    assert again[0].endswith("made again what was missing at schema 4")
    assert again[1].strip() == f"made: table {state}, index {state}_pkey"
    assert again[3].strip() == f"made: table {archive}_erased, index {archive}_erased_pkey"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"UPDATE {state}_meta SET version = 99")
    assert main(["migrate", "--state", postgres_url, "--state-table", state]) == 2
    err = capsys.readouterr().err
    assert f"table {state!r} has state store schema 99, newer than this demote's 4" in err
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(f"SELECT version FROM {state}_meta").fetchone() == (99,)


def test_redis_has_nothing_to_migrate(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = migrate(["--state", redis_url], capsys)
    assert out == [f"state:   {redis_url} (keys demote:*): nothing to do: Redis keeps no schema "
                   "(keys are written as needed)"]  # fmt: skip
    assert main(["migrate", "--state", "redis://127.0.0.1:1/0"]) == 2
    assert "ConnectionError" in capsys.readouterr().err


def test_nothing_given_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate"]) == 2
    assert "give at least one of --state, --archive, --outbox" in capsys.readouterr().err
