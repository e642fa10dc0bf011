"""Redis and Postgres stores under faults: cut connections, black holes, killed backends.

Connections go through a TCP proxy on 127.0.0.1 (tests/support/tcp_proxy.py) that can cut
every connection or stop forwarding without closing. The stores must recover with no
process restart, and a black-holed call must fail with StoreError within its timeout.
Every loop here is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from demote import ConversationState
from demote.errors import StoreError
from demote.state import PostgresStateStore, RedisStateStore
from tests.demote.state.conftest import Facade, _closer, drop_pg_tables
from tests.support.tcp_proxy import TcpProxy

S1 = ConversationState(window_start=1, delivered=1)
TIMEOUT = 1.0


def state(n: int) -> ConversationState:
    return ConversationState(window_start=n, delivered=n)


def eventually(call: Callable[[], Any], seconds: float = 15.0, tries: int = 60) -> Any:
    """``call()``'s first success, retrying StoreError (bounded in count and time)."""
    deadline = time.monotonic() + seconds
    for _ in range(tries):
        try:
            return call()
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)
    raise AssertionError(f"no success in {tries} tries")


@pytest.fixture(params=["redis", "postgres"])
def proxied(
    request: pytest.FixtureRequest, mode: asyncio.AbstractEventLoop | None
) -> Iterator[tuple[TcpProxy, Facade]]:
    """A store whose every connection goes through a fresh proxy."""
    url = request.getfixturevalue(f"{request.param}_url")
    parts = urlsplit(url)
    proxy = TcpProxy(parts.port or (6379 if request.param == "redis" else 5432)).start()
    netloc = parts.netloc.rsplit("@", 1)
    auth = f"{netloc[0]}@" if len(netloc) == 2 else ""
    via = f"{parts.scheme}://{auth}127.0.0.1:{proxy.port}{parts.path}"
    store: Any
    if request.param == "redis":
        store = RedisStateStore(
            via,
            prefix=f"f{uuid.uuid4().hex[:8]}:",
            socket_timeout=TIMEOUT,
            socket_connect_timeout=TIMEOUT,
        )
    else:
        table = f"t_{uuid.uuid4().hex[:12]}"
        request.addfinalizer(lambda: drop_pg_tables(url, table))
        store = PostgresStateStore(
            via, table=table, timeout=TIMEOUT, connect_timeout=2, statement_timeout=TIMEOUT
        )
    yield proxy, Facade(store, mode)
    proxy.restore()
    try:
        _closer(store, mode)
    finally:
        proxy.close()


def test_recovers_after_every_connection_is_cut(proxied: tuple[TcpProxy, Facade]) -> None:
    proxy, store = proxied
    assert store.compare_and_set("c", None, S1)
    for n in range(2, 5):
        proxy.cut()
        # The next call reconnects: no restart, at most a bounded retry.
        lease = eventually(lambda: store.acquire_lease("c", "w", 30))
        assert lease is not None and lease.state == state(n - 1)
        proxy.cut()
        assert eventually(
            lambda lease=lease, n=n: store.compare_and_set(
                "c", state(n - 1), state(n), lease=lease, release=True
            )
        )
    assert store.get("c") == state(4)
    assert proxy.accepted >= 4, "the store really reconnected through the proxy"


def test_a_black_holed_connection_fails_within_its_timeout(
    proxied: tuple[TcpProxy, Facade],
) -> None:
    proxy, store = proxied
    assert store.compare_and_set("c", None, S1)
    proxy.blackhole()
    for call in (lambda: store.get("c"), lambda: store.compare_and_set("c", S1, state(2))):
        started = time.monotonic()
        with pytest.raises(StoreError):
            call()
        elapsed = time.monotonic() - started
        assert elapsed < 3 * TIMEOUT + 2, f"took {elapsed:.1f} s for a {TIMEOUT} s timeout"
    proxy.restore()
    assert eventually(lambda: store.get("c")) == S1, "recovers once the network does"
    assert store.compare_and_set("c", S1, state(2))


# --- Postgres: backends terminated from an admin connection -------------------------


def _terminate(url: str, name: str) -> list[int]:
    """Terminate every backend of ``application_name`` ``name``; wait until they are gone."""
    with psycopg.connect(url, autocommit=True) as admin:
        pids = [
            pid
            for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchall()
        ]
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()
            if row is None or not row[0]:
                break
            time.sleep(0.05)
        return pids


def test_postgres_recovers_after_its_backends_are_terminated(
    postgres_url: str, mode: asyncio.AbstractEventLoop | None
) -> None:
    table, name = f"t_{uuid.uuid4().hex[:12]}", f"demote-test-{uuid.uuid4().hex[:8]}"
    raw = PostgresStateStore(postgres_url, table=table, application_name=name, min_size=2)
    store = Facade(raw, mode)
    try:
        assert store.compare_and_set("c", None, S1)
        for n in range(2, 5):
            assert store.get("c") == state(n - 1)
            assert _terminate(postgres_url, name), "the store had live backends to kill"
            # No retry: the pool notices the dead connections before using them.
            assert store.compare_and_set("c", state(n - 1), state(n))
        assert store.get("c") == state(4)
    finally:
        _closer(raw, mode)
        drop_pg_tables(postgres_url, table)


def test_postgres_backends_terminated_mid_run(postgres_url: str) -> None:
    """Four threads keep committing while every backend is killed twice: each thread
    sees at most a StoreError or two at the moment of the kill, never another error,
    and every thread commits again afterwards."""
    table, name = f"t_{uuid.uuid4().hex[:12]}", f"demote-test-{uuid.uuid4().hex[:8]}"
    store = PostgresStateStore(postgres_url, table=table, application_name=name, max_size=4)
    errors: list[BaseException] = []
    commits_after: dict[int, int] = {}
    killed = threading.Event()
    stop = time.monotonic() + 3.0

    def work(n: int) -> None:
        cid, current, known = f"c{n}", None, True
        for i in range(10_000):
            if time.monotonic() > stop:
                break
            try:
                if not known:  # a failed commit may or may not have landed: re-read
                    current, known = store.get(cid), True
                if store.compare_and_set(cid, current, state(i)):
                    current = state(i)
                    if killed.is_set():
                        commits_after[n] = commits_after.get(n, 0) + 1
            except StoreError:
                known = False
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    try:
        for t in threads:
            t.start()
        for _ in range(2):
            time.sleep(0.5)
            _terminate(postgres_url, name)
        killed.set()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert sorted(commits_after) == [0, 1, 2, 3], commits_after
    finally:
        store.close()
        drop_pg_tables(postgres_url, table)
