"""A state store in PostgreSQL, for several workers or hosts (extra ``demote[postgres]``).

One row per conversation in ``table`` (default ``demote_state``), one per held lease in
``{table}_lease`` (holder, fencing token, expiry by the server's clock), fencing tokens
from the sequence ``{table}_fence``, the schema version in ``{table}_meta``. Tables of
earlier releases are migrated in place when the store opens (see ``_pg_sql``).

Every operation is one SQL statement, so one round trip on the pool's autocommit
connections; the statements are written once (``_pg_sql.Sql``) and executed by a sync
driver over a ``psycopg_pool.ConnectionPool`` and an async one over an
``AsyncConnectionPool`` (one per event loop), both built from the same settings.

Failure handling, for a fleet:

- connections have a connect timeout, a server-side ``statement_timeout``, TCP
  keepalives and ``tcp_user_timeout``;
- each operation has a client-side deadline (``timeout``) covering the wait for a pooled
  connection and the round trip: a black-holed connection is shut down when it passes
  and the call fails with :class:`StoreError`;
- a pooled connection whose server went away (``pg_terminate_backend``, a restart, a cut
  proxy) is noticed before use without a round trip (its idle socket turned readable)
  and replaced, so the store recovers with no process restart.

Every psycopg error becomes a :class:`StoreError` at this boundary.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from demote.errors import ConfigError, MissingExtraError, StoreError
from demote.records import ConversationState
from demote.state._codec import check_ttl, state_from_row, storable_id
from demote.state._deadline import (
    Deadline,
    idle_socket_has_data,
    loop_deadline,
    thread_deadline,
)
from demote.state._loops import PerLoop
from demote.state._ops import Op, OpStore
from demote.state._pg_sql import SCHEMA_VERSION, Sql
from demote.state.base import Lease

__all__ = ["PostgresStateStore"]

T = TypeVar("T")
_IDENT = re.compile(r"[a-z_][a-z0-9_]{0,50}")
Rows = list[tuple[Any, ...]]


def _op(sql: str, params: dict[str, Any], finish: Callable[[Rows], T]) -> Op[T]:
    """One statement and how to read its rows."""
    return Op((sql, params), finish)


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _dead(conn: Any) -> bool:
    """Whether a pooled connection is unusable (closed, broken, or its server left)."""
    try:
        return bool(conn.closed) or idle_socket_has_data(conn.pgconn.socket)
    except Exception:  # psycopg raises on a closed pgconn's socket
        return True


class _Attempt:
    """The alarm of the round trip in flight, read when translating its error."""

    alarm: Deadline | None = None


class PostgresStateStore(OpStore):
    """Conversation states and fenced leases in PostgreSQL.

    Args:
        dsn: A libpq connection string or URL (``postgresql://user@host:5432/db``).
            The store builds its own pools from it. Give ``dsn`` or ``pool``.
        pool: An existing ``psycopg_pool.ConnectionPool`` to use instead (not closed by
            :meth:`close`). Autocommit connections save a round trip per operation.
        async_pool: An existing ``AsyncConnectionPool`` for the async twins (not closed
            by :meth:`close`); without it they use pools built like the sync one.
        table: Table name (created or migrated if needed): lowercase letters, digits,
            underscores.
        timeout: Client-side deadline of one operation, in seconds: waiting for a pooled
            connection plus the round trip. Past it the call fails with StoreError.
        connect_timeout: Seconds to establish a connection (libpq rounds up, minimum 2).
        statement_timeout: Server-side limit of one statement, in seconds.
        min_size: Connections each pool keeps open.
        max_size: Connections each pool may open.
        keepalives_idle: Seconds of idleness before TCP keepalive probes start.
        application_name: Shown in ``pg_stat_activity`` (name each worker to find its
            sessions).
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: Any = None,
        async_pool: Any = None,
        table: str = "demote_state",
        timeout: float = 10.0,
        connect_timeout: float = 5.0,
        statement_timeout: float = 5.0,
        min_size: int = 1,
        max_size: int = 10,
        keepalives_idle: int = 30,
        application_name: str = "demote",
    ) -> None:
        if not isinstance(table, str) or not _IDENT.fullmatch(table):
            raise ConfigError(f"table: {table!r} is not a plain lowercase identifier")
        if (dsn is None) == (pool is None):
            raise ConfigError("give exactly one of dsn and pool")
        self.timeout = _positive("timeout", timeout)
        statement_ms = round(_positive("statement_timeout", statement_timeout) * 1000)
        try:
            import psycopg
            import psycopg_pool
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError("psycopg", "postgres") from exc
        self.table = table
        self._sql = Sql(table)
        self._errors: tuple[type[BaseException], ...] = (psycopg.Error, OSError)
        self._attempts = max_size + 1
        self._closed = False
        self._owns_pool = pool is None
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(2, math.ceil(_positive("connect_timeout", connect_timeout))),
            "keepalives": 1,
            "keepalives_idle": keepalives_idle,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": round(self.timeout * 1000),
            "application_name": application_name,
        }
        setup = f"SET statement_timeout = {statement_ms}"

        def configure(conn: Any) -> None:
            conn.execute(setup)

        async def aconfigure(conn: Any) -> None:
            await conn.execute(setup)

        if pool is None:
            with (
                self._translated(_Attempt(), "cannot reach postgres"),
                psycopg.connect(dsn or "", **kwargs) as conn,
            ):
                self._migrate(conn)
            pool = psycopg_pool.ConnectionPool(
                dsn or "",
                kwargs=kwargs,
                configure=configure,
                min_size=min_size,
                max_size=max_size,
                timeout=self.timeout,
                name=f"demote-{table}",
                open=True,
            )
        else:
            with (
                self._translated(_Attempt(), "cannot reach postgres"),
                pool.connection(timeout=self.timeout) as conn,
            ):
                self._migrate(conn)
        self._pool = pool

        async def make() -> Any:
            if async_pool is not None:
                return async_pool
            made = psycopg_pool.AsyncConnectionPool(
                pool.conninfo,
                kwargs=pool.kwargs,
                configure=aconfigure if self._owns_pool else None,
                min_size=min_size,
                max_size=max_size,
                timeout=self.timeout,
                name=f"demote-{table}-async",
                open=False,
            )
            await made.open()
            return made

        async def close(made: Any) -> None:
            if made is not async_pool:
                await made.close()

        self._async: PerLoop[Any] = PerLoop(make, close)

    def _migrate(self, conn: Any) -> None:
        """Create or upgrade the tables to :data:`SCHEMA_VERSION` (one transaction)."""
        sql = self._sql
        if conn.execute(sql.meta_exists).fetchone()[0]:
            (version,) = conn.execute(sql.version).fetchone()
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"table {self.table!r} has state store schema {version}, newer than this "
                    f"demote's {SCHEMA_VERSION}: upgrade demote"
                )
            if version == SCHEMA_VERSION:
                return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"demote:{self.table}",))
            for statement in sql.migrations():
                conn.execute(statement)

    @contextmanager
    def _translated(self, attempt: _Attempt, what: str = "postgres") -> Iterator[None]:
        try:
            yield
        except self._errors as exc:  # psycopg errors become ours at this boundary
            if attempt.alarm is not None and attempt.alarm.fired:
                raise StoreError(
                    f"{what}: no reply within {self.timeout:g} s (connection dropped)"
                ) from exc
            raise StoreError(f"{what}: {type(exc).__name__}: {exc}") from exc

    def _left(self, deadline: float) -> float:
        return max(0.001, deadline - time.monotonic())

    def _run(self, op: Op[T]) -> T:
        if self._closed:
            raise StoreError("postgres state store is closed")
        deadline, attempt = time.monotonic() + self.timeout, _Attempt()
        with self._translated(attempt):
            for _ in range(self._attempts):
                with self._pool.connection(timeout=self._left(deadline)) as conn:
                    if _dead(conn):
                        conn.close()  # the pool replaces it
                        continue
                    with thread_deadline(conn.pgconn.socket, self._left(deadline)) as alarm:
                        attempt.alarm = alarm
                        cur = conn.execute(*op.request)
                        rows = cur.fetchall() if cur.description else []
                        if not conn.autocommit:
                            conn.commit()
                return op.finish(rows)
        raise StoreError(f"postgres: no live connection in {self._attempts} tries")

    async def _arun(self, op: Op[T]) -> T:
        if self._closed:
            raise StoreError("postgres state store is closed")
        deadline, attempt = time.monotonic() + self.timeout, _Attempt()
        with self._translated(attempt):
            pool = await self._async.get()
            for _ in range(self._attempts):
                async with pool.connection(timeout=self._left(deadline)) as conn:
                    if _dead(conn):
                        await conn.close()  # the pool replaces it
                        continue
                    with loop_deadline(conn.pgconn.socket, self._left(deadline)) as alarm:
                        attempt.alarm = alarm
                        cur = await conn.execute(*op.request)
                        rows = await cur.fetchall() if cur.description else []
                        if not conn.autocommit:
                            await conn.commit()
                return op.finish(rows)
        raise StoreError(f"postgres: no live connection in {self._attempts} tries")

    # The operations, described once; _run and _arun perform them.

    def _get_op(self, conversation_id: str) -> Op[ConversationState | None]:
        def finish(rows: Rows) -> ConversationState | None:
            return state_from_row(rows[0]) if rows else None

        return _op(self._sql.get, {"id": storable_id(conversation_id)}, finish)

    def _count_op(self) -> Op[int]:
        return _op(self._sql.count, {}, lambda rows: int(rows[0][0]))

    def _cas_op(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        lease: Lease | None,
        release: bool,
    ) -> Op[bool]:
        cid = storable_id(conversation_id)
        release = release and lease is not None
        sql = self._sql.cas(expected is not None, lease is not None, release)
        params = self._sql.cas_params(cid, expected, new, lease)
        return _op(sql, params, lambda rows: rows[0][0] == 1)

    def _clear_op(self, conversation_id: str) -> Op[ConversationState]:
        params = self._sql.clear_params(storable_id(conversation_id))
        return _op(self._sql.clear, params, lambda rows: state_from_row(rows[0]))

    def _delete_op(self, conversation_id: str) -> Op[None]:
        return _op(self._sql.delete, {"id": storable_id(conversation_id)}, lambda rows: None)

    def _acquire_op(self, conversation_id: str, holder: str, ttl: float) -> Op[Lease | None]:
        cid = storable_id(conversation_id)

        def finish(rows: Rows) -> Lease | None:
            if not rows:
                return None
            token, *row = rows[0]
            state = None if row[0] is None else state_from_row(row)
            return Lease(cid, holder, int(token), state)

        params = {"id": cid, "holder": holder, "ttl": check_ttl(ttl)}
        return _op(self._sql.acquire, params, finish)

    def _renew_op(self, lease: Lease, ttl: float) -> Op[bool]:
        params = {
            "id": storable_id(lease.conversation_id),
            "holder": lease.holder,
            "token": lease.token,
            "ttl": check_ttl(ttl),
        }
        return _op(self._sql.renew, params, lambda rows: bool(rows))

    def _release_op(self, lease: Lease) -> Op[None]:
        cid = storable_id(lease.conversation_id)
        params = {"id": cid, "holder": lease.holder, "token": lease.token}
        return _op(self._sql.release, params, lambda rows: None)

    def close(self) -> None:
        """Close the pools this store made (idempotent); async ones on their loops."""
        if self._closed:
            return
        self._closed = True
        self._async.close_all()
        if self._owns_pool:
            self._pool.close()

    async def aclose(self) -> None:
        """Close this loop's async pool, then everything :meth:`close` closes."""
        await self._async.close_current()
        self.close()
