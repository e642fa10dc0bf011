"""PostgresStateStore beyond the contract: migration, bad rows, pools, options."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import psycopg_pool
import pytest

from demote import ConversationState, StoreError
from demote.errors import ConfigError
from demote.state import PostgresStateStore
from demote.state._pg_sql import SCHEMA_VERSION
from tests.demote.archive.pg import drop_archive
from tests.demote.state.conftest import drop_pg_tables

S1 = ConversationState(window_start=4, delivered=4, anchor="ab")
S2 = ConversationState(window_start=9, delivered=7, summary="s", generation=3)


@pytest.fixture
def table(postgres_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_pg_tables(postgres_url, name)


def test_tables_of_the_previous_layout_migrate_and_keep_their_states(
    postgres_url: str, table: str
) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # what the old code made
        conn.execute(
            f"CREATE TABLE {table} (conversation_id TEXT PRIMARY KEY, "
            "window_start BIGINT NOT NULL, delivered BIGINT NOT NULL, "
            "pinned BIGINT NOT NULL, anchor TEXT, summary TEXT, "
            'summarized BIGINT NOT NULL, "offset" BIGINT NOT NULL, generation BIGINT NOT NULL)'
        )
        conn.execute(
            f"CREATE TABLE {table}_lease (conversation_id TEXT PRIMARY KEY, "
            "holder TEXT NOT NULL, expires TIMESTAMPTZ NOT NULL)"
        )
        conn.execute(f"INSERT INTO {table} VALUES ('a', 4, 4, 0, 'ab', NULL, 0, 0, 0)")
        conn.execute(f"INSERT INTO {table}_lease VALUES ('b', 'old', now() + interval '1 hour')")
    with PostgresStateStore(postgres_url, table=table) as store:
        assert store.get("a") == S1 and store.count() == 1
        assert store.acquire_lease("b", "w", 30) is None, "the old lease still excludes"
        lease = store.acquire_lease("a", "w", 30)
        assert lease is not None and lease.state == S1 and lease.token >= 1
        assert store.compare_and_set("a", S1, S2, lease=lease, release=True)
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(f"SELECT version FROM {table}_meta").fetchone() == (SCHEMA_VERSION,)
    with PostgresStateStore(postgres_url, table=table) as store:
        assert store.get("a") == S2


def test_a_newer_schema_is_refused(postgres_url: str, table: str) -> None:
    PostgresStateStore(postgres_url, table=table).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"UPDATE {table}_meta SET version = 99")
    with pytest.raises(StoreError, match="newer"):
        PostgresStateStore(postgres_url, table=table)


def test_a_table_of_the_wrong_types_is_a_store_error(postgres_url: str, table: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (conversation_id TEXT PRIMARY KEY, window_start TEXT, "
            "delivered TEXT, pinned TEXT, anchor TEXT, summary TEXT, summarized TEXT, "
            '"offset" TEXT, generation BIGINT)'
        )
        conn.execute(f"INSERT INTO {table} VALUES ('a', 'four', '4', '0', NULL, NULL, '0', '0', 0)")
    with PostgresStateStore(postgres_url, table=table) as store:
        with pytest.raises(StoreError, match="corrupt"):
            store.get("a")
        with pytest.raises(StoreError):
            store.compare_and_set("a", S1, S2)


def test_an_existing_pool_is_used_and_left_open(postgres_url: str, table: str) -> None:
    pool = psycopg_pool.ConnectionPool(postgres_url, min_size=1, max_size=2, open=True)
    try:  # not autocommit: each operation commits its own transaction
        with PostgresStateStore(pool=pool, table=table) as store:
            assert store.compare_and_set("a", None, S1)
            lease = store.acquire_lease("a", "w", 30)
            assert lease is not None
            assert store.compare_and_set("a", S1, S2, lease=lease, release=True)

            async def main() -> ConversationState | None:
                got = await store.aget("a")
                await store.aclose()
                return got

            assert asyncio.run(main()) == S2
        with pool.connection() as conn:
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)
    finally:
        pool.close()


def test_settings_are_checked() -> None:
    url = "postgresql://127.0.0.1:1/x"
    with pytest.raises(ConfigError, match="table"):
        PostgresStateStore(url, table="x; drop")
    with pytest.raises(ConfigError, match="dsn"):
        PostgresStateStore()
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="timeout"):
            PostgresStateStore(url, timeout=bad)


def test_a_store_made_while_postgres_is_down_fails_its_calls_not_its_construction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="demote"):
        store = PostgresStateStore("postgresql://postgres@127.0.0.1:1/test", connect_timeout=2)
    try:
        assert "built without it" in caplog.text and "Connection refused" in caplog.text
        with pytest.raises(StoreError, match="postgres"):
            store.get("a")
    finally:
        store.close()


def test_a_refusal_for_good_still_raises_at_construction(postgres_url: str) -> None:
    base = postgres_url.rsplit("/", 1)[0]
    with pytest.raises(StoreError, match="does not exist"):
        PostgresStateStore(f"{base}/demote_no_such_database")


_NEVER_CLOSED = """
import asyncio, sys
from demote.archive.postgres import PostgresArchive
from demote.state import PostgresStateStore
url, prefix = sys.argv[1], sys.argv[2]
for n in range(12):
    store = PostgresStateStore(url, table=f"{prefix}_s{n}")
    archive = PostgresArchive(url, table=f"{prefix}_a{n}")
    for _ in range(2):
        assert asyncio.run(store.aget("c")) is None
        assert asyncio.run(archive.asearch("c", "hello")) == []
print("done")
"""


def test_asyncio_run_returns_although_the_store_is_never_closed(postgres_url: str) -> None:
    """Each ``asyncio.run`` ends with the pool it made closed (its keeper task), though
    nobody closes the store: a psycopg pool caught mid-connect at loop end hung it once
    in three rounds before. Run in a child process, so that a hang is a failure here."""
    import subprocess
    import sys

    prefix = f"t_{uuid.uuid4().hex[:8]}"
    try:
        done = subprocess.run(
            [sys.executable, "-c", _NEVER_CLOSED, postgres_url, prefix],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("asyncio.run hung at loop end on a store nobody closed")
    finally:
        for n in range(12):
            drop_pg_tables(postgres_url, f"{prefix}_s{n}")
            drop_archive(postgres_url, f"{prefix}_a{n}")
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]
