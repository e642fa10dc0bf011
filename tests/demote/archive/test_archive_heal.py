"""A PostgreSQL archive table or text search object dropped under a running archive.

The next operation that finds it missing makes it again (as when the archive was first
opened), runs once more and says so in a warning: a delivery, a search, an erase go on
instead of failing until a restart. A read-only archive (the command line's) makes
nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from demote import FencedOut, StoreError
from demote.archive.postgres import PostgresArchive
from tests.demote.archive.archive_contract import FILLER, batch
from tests.demote.archive.pg import drop_archive


@pytest.fixture
def table(postgres_url: str) -> Iterator[str]:
    name = f"heal_{uuid.uuid4().hex[:10]}"
    yield name
    drop_archive(postgres_url, name)


def execute(url: str, sql: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


@pytest.mark.parametrize(
    "dropped",
    [
        "TABLE {t} CASCADE",
        "TABLE {t}_conversations CASCADE",
        "TABLE {t}_terms",
        "TABLE {t}_erased",
        "TEXT SEARCH CONFIGURATION {t}_fts",
    ],
)
def test_a_dropped_object_is_made_again_by_the_next_delivery(
    postgres_url: str, table: str, dropped: str, caplog: pytest.LogCaptureFixture
) -> None:
    with PostgresArchive(postgres_url, table=table) as archive:
        archive.deliver(batch("c", "the locker code is 4512", *FILLER))
        execute(postgres_url, "DROP " + dropped.format(t=table))
        with caplog.at_level("WARNING", logger="demote"):
            archive.deliver(batch("d", "my cat is called Miso", *FILLER))
        assert "made again" in caplog.text
        assert archive.search("d", "what is my cat called?", k=1)[0].text.endswith("Miso")
        assert archive.erase("d", fence=7) == 1 + len(FILLER)
        with pytest.raises(FencedOut, match="older than its erase"):
            archive.deliver(batch("d", "late", fence=3))


def test_statistics_dropped_are_counted_again_from_the_messages(
    postgres_url: str, table: str
) -> None:
    with PostgresArchive(postgres_url, table=table) as archive:
        archive.deliver(batch("c", "the locker code is 4512", *FILLER))
        archive.deliver(batch("d", "my cat is called Miso", *FILLER, start=0))
        before = {cid: archive.search(cid, "locker code cat", k=2) for cid in ("c", "d")}
        execute(postgres_url, f"DROP TABLE {table}_conversations CASCADE")
        archive.deliver(batch("e", "a new conversation"))
        assert [archive.count(c) for c in ("c", "d", "e")] == [5, 5, 1]
        after = {cid: archive.search(cid, "locker code cat", k=2) for cid in ("c", "d")}
        assert after == before  # the same statistics, so the same ranking


def test_the_async_twins_heal_too(postgres_url: str, table: str) -> None:
    async def main() -> int:
        archive = PostgresArchive(postgres_url, table=table)
        try:
            await archive.adeliver(batch("c", "first", *FILLER))
            execute(postgres_url, f"DROP TABLE {table} CASCADE")
            await archive.adeliver(batch("c", "second"))
            return await archive.acount("c")
        finally:
            await archive.aclose()

    assert asyncio.run(main()) == 1  # the messages went, so did their statistics


def test_a_read_only_archive_makes_nothing(postgres_url: str, table: str) -> None:
    PostgresArchive(postgres_url, table=table).close()
    with PostgresArchive(postgres_url, table=table, read_only=True) as reader:
        execute(postgres_url, f"DROP TABLE {table} CASCADE")
        with pytest.raises(StoreError, match="does not exist"):
            reader.messages("c")
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(f"SELECT to_regclass('{table}')").fetchone() == (None,)
