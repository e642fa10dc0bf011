"""A table dropped under a running store is made again on its next use, as at first use.

An operator (or a migration tool, or a test database reset) drops ``demote_state``, its
lease table or its fencing sequence while workers run. The next operation that finds it
missing makes it again (idempotently, at the newest layout), runs once more, and says so
in a warning; the engine's loads stop being degraded at once instead of staying degraded
with ``UndefinedTable`` forever. A fencing counter made again only hands out tokens
larger than any before.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from demote import ConversationState, Demoter, SlidingWindow, SQLiteArchive, SQLiteStateStore
from demote.state import PostgresStateStore
from tests.demote.state.conftest import drop_pg_tables

S1 = ConversationState(window_start=2, delivered=2)


class Backend:
    """A durable store and how to drop one of its tables behind its back."""

    def __init__(self, store: Any, drop: Callable[[str], None], names: dict[str, str]) -> None:
        self.store = store
        self.drop = drop
        self.names = names  # "state", "lease", "fence" -> the object's name


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        path = tmp_path / "state.db"
        store = SQLiteStateStore(path)

        def drop_sqlite(name: str) -> None:
            db = sqlite3.connect(path)
            db.execute(f"DROP TABLE {name}")
            db.commit()
            db.close()

        names = {"state": "demote_state", "lease": "demote_lease", "fence": "demote_fence"}
        yield Backend(store, drop_sqlite, names)
        store.close()
        return
    url = request.getfixturevalue("postgres_url")
    table = f"heal_{uuid.uuid4().hex[:10]}"
    store = PostgresStateStore(url, table=table)

    def drop_pg(name: str) -> None:
        kind = "SEQUENCE" if name.endswith("_fence") else "TABLE"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP {kind} {name}")

    names = {"state": table, "lease": f"{table}_lease", "fence": f"{table}_fence"}
    yield Backend(store, drop_pg, names)
    store.close()
    drop_pg_tables(url, table)


def describe_with(demoter: Demoter) -> Callable[[tuple[str, str]], Any]:
    return lambda m: demoter.describe(m[0], m[1])


def chat(n: int) -> list[tuple[str, str]]:
    return [("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(n)]


def test_a_dropped_state_table_is_made_again_and_turns_are_not_degraded(
    backend: Backend, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    demoter = Demoter(SlidingWindow.last_messages(4), archive, state=backend.store, hook_wait=None)
    describe = describe_with(demoter)
    try:
        assert not demoter.load("c", chat(8), describe).degraded
        backend.drop(backend.names["state"])
        with caplog.at_level("WARNING", logger="demote"):
            windows = [demoter.load("c", chat(n), describe) for n in (10, 12, 14)]
        assert [w.degraded for w in windows] == [False, False, False]
        assert "made again" in caplog.text
        state = backend.store.get("c")  # committed into the new table
        assert state is not None and state.delivered == windows[-1].start == 10
        # The dropped state is lost, so what it recorded is handed over again (at least
        # once, as after any loss of state): the archive keeps each message once.
        assert [m.index for m in archive.messages("c")] == list(range(10))
    finally:
        demoter.close()
        archive.close()


def test_dropped_lease_table_and_fence_are_made_again_and_tokens_only_grow(
    backend: Backend,
) -> None:
    store = backend.store
    first = store.acquire_lease("c", "w1", 30)
    assert first is not None
    store.release_lease(first)
    backend.drop(backend.names["lease"])
    backend.drop(backend.names["fence"])
    second = store.acquire_lease("c", "w2", 30)
    assert second is not None and second.token > first.token
    assert store.compare_and_set("c", None, S1, lease=second, release=True)
    assert store.get("c") == S1


def test_the_async_twins_heal_too(backend: Backend) -> None:
    store = backend.store
    backend.drop(backend.names["state"])

    async def main() -> ConversationState | None:
        assert await store.acompare_and_set("c", None, S1)
        return await store.aget("c")

    assert asyncio.run(main()) == S1
    if hasattr(store, "aclose"):
        asyncio.run(store.aclose())


def test_a_read_only_store_does_not_make_a_dropped_table(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SQLiteStateStore(path).close()
    with SQLiteStateStore(path, read_only=True) as reader:
        db = sqlite3.connect(path)
        db.execute("DROP TABLE demote_state")
        db.commit()
        db.close()
        with pytest.raises(Exception, match="no such table"):
            reader.get("c")
    db = sqlite3.connect(path)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    db.close()
    assert "demote_state" not in tables
