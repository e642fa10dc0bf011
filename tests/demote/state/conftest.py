"""Fixtures of the state store tests: every store, sync or async, sharing a namespace.

``stores`` is a factory: each call opens another store object on the same backend
namespace (the same in-memory instance, SQLite file, Redis prefix or Postgres table),
as two processes would. ``mode`` runs each method either directly or through its async
twin on an event loop of the test's own (a store without twins must be ``nonblocking``,
as the engine's async path expects).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from demote.state import InMemoryStateStore, PostgresStateStore, RedisStateStore, SQLiteStateStore

BACKENDS = ["memory", "sqlite", "redis", "postgres"]
DURABLE = ["sqlite", "redis", "postgres"]


class Facade:
    """A store whose methods run sync, or through their async twins on ``loop``."""

    def __init__(self, store: Any, loop: asyncio.AbstractEventLoop | None) -> None:
        self.store = store
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        sync = getattr(self.store, name)
        if self._loop is None or not callable(sync):
            return sync
        twin = getattr(self.store, "a" + name, None)
        if twin is None:
            assert getattr(self.store, "nonblocking", False), f"{name} has no async twin"
            return sync
        loop = self._loop

        def call(*args: Any, **kwargs: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(twin(*args, **kwargs), loop).result(60)

        return call


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop | None]:
    """``None`` (sync calls) or a running event loop the async twins are awaited on."""
    if request.param == "sync":
        yield None
        return
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def drop_pg_tables(url: str, table: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for suffix in ("", "_lease", "_meta"):
            conn.execute(f"DROP TABLE IF EXISTS {table}{suffix}")
        conn.execute(f"DROP SEQUENCE IF EXISTS {table}_fence")


def opener(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    """A function opening a raw store of ``kind`` on one namespace per test."""
    if kind == "memory":
        shared = InMemoryStateStore()
        return lambda **kw: shared
    if kind == "sqlite":
        path = tmp_path / "state.db"
        return lambda **kw: SQLiteStateStore(path, **kw)
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = f"t{uuid.uuid4().hex[:8]}:"
        return lambda **kw: RedisStateStore(url, prefix=prefix, **kw)
    url = request.getfixturevalue("postgres_url")
    table = f"t_{uuid.uuid4().hex[:12]}"
    request.addfinalizer(lambda: drop_pg_tables(url, table))
    return lambda **kw: PostgresStateStore(url, table=table, **kw)


def _closer(store: Any, loop: asyncio.AbstractEventLoop | None) -> None:
    if loop is not None and hasattr(store, "aclose"):
        asyncio.run_coroutine_threadsafe(store.aclose(), loop).result(30)
    store.close()


@pytest.fixture(params=BACKENDS)
def stores(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    mode: asyncio.AbstractEventLoop | None,
) -> Iterator[Callable[[], Facade]]:
    """Opens stores (as facades) sharing one namespace; closes them after the test."""
    open_raw = opener(request.param, request, tmp_path)
    made: list[Any] = []

    def make() -> Facade:
        made.append(open_raw())
        return Facade(made[-1], mode)

    yield make
    for store in made:
        _closer(store, mode)
