"""PostgreSQL connections for a fleet, shared by the state store and the archive.

:class:`Pools` holds a ``psycopg_pool.ConnectionPool`` (built from a DSN, or the caller's)
and one ``AsyncConnectionPool`` per event loop, and runs a unit of work on one live
connection of either, sync or async:

- connections have a connect timeout, a server-side ``statement_timeout``, TCP
  keepalives and ``tcp_user_timeout`` (when the pools are built here);
- each unit of work has a client-side deadline (``timeout``) covering the wait for a
  pooled connection and every round trip of the work: a black-holed connection is shut
  down when it passes (:mod:`demote.backends.deadline`) and the call fails with
  :class:`~demote.errors.StoreError`;
- a pooled connection whose server went away (``pg_terminate_backend``, a restart, a cut
  proxy) is noticed before use without a round trip (its idle socket turned readable)
  and replaced, so the caller recovers with no process restart;
- a pool built here gives up reconnecting in the background after ``timeout``
  (psycopg_pool's ``reconnect_timeout``; its own backoff starts at 1 s and doubles, which
  would hold a recovered server off for seconds) and grows again when the next caller
  waits, so the first call after the server is back connects at once;
- a connection that is not in autocommit mode is committed after the work.

Tables (theory of operation). The caller's ``setup`` creates, checks or upgrades its
tables; it runs once, on the first connection, before any work:

- at construction, on a direct connection, so that a schema problem (a newer schema, a
  table of another program) raises :class:`StoreError` there, as it always did. A server
  that cannot be reached then (refused, timed out, black-holed) is not an error: the
  pools are built all the same (they connect in the background), a warning says so on
  the ``demote`` logger, and ``setup`` runs before the first work that finds the server
  (:attr:`Pools.ready` is ``False`` until then). Every call before that fails like a call
  to a server that went down later (:class:`StoreError` from the connection error), so
  the engine's loads are degraded and its breaker probes the server back. A server that
  answers but refuses the connection for good (no such database or role, a failed
  password) still raises at construction: waiting would not heal that;
- on a table, sequence or text search object found missing by a unit of work
  (``UndefinedTable``, ``UndefinedObject``: an operator dropped it), ``setup`` runs again
  in repair mode (it re-creates what is missing, idempotently, as at first use), once,
  and the work is retried once; a warning says what was made again.

``setup`` runs inside one transaction with its own statement timeout
(:data:`SETUP_SECONDS`), under the same client-side deadline extended to it: a few DDL
statements, longer than one operation's deadline, paid once per process (or heal).

Every psycopg error (and ``OSError``) becomes a :class:`StoreError` at this boundary.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from demote._validate import count, seconds
from demote.backends.breaker import is_outage
from demote.backends.deadline import Deadline, idle_socket_has_data, loop_deadline, thread_deadline
from demote.backends.loops import PerLoop
from demote.errors import ArgumentTypeError, ConfigError, MissingExtraError, StoreError

__all__ = [
    "SETUP_SECONDS",
    "Pools",
    "Setup",
    "atransaction",
    "missing_object",
    "positive",
    "table_name",
    "transaction",
]

logger = logging.getLogger("demote")

#: Seconds the tables' creation, check or repair may take once a connection is had.
SETUP_SECONDS = 5.0

#: SQLSTATEs of a relation (table, sequence) or another object (a text search
#: configuration) that does not exist.
_MISSING = frozenset({"42P01", "42704"})

#: What a server that answered says when it refuses a connection for good.
_REFUSED_FOR_GOOD = ("does not exist", "authentication failed", "no pg_hba.conf entry")

#: ``setup(connection, repair)``: create, check or upgrade the tables; with ``repair``,
#: also re-create whatever is missing (idempotent).
Setup = Callable[[Any, bool], None]


def missing_object(error: BaseException) -> bool:
    """Does ``error`` (or one of its causes) say a table, sequence or object is missing?"""
    current: BaseException | None = error
    for _ in range(8):
        if current is None:
            return False
        if getattr(current, "sqlstate", None) in _MISSING:
            return True
        current = current.__cause__ or current.__context__
    return False


def _unreachable(error: StoreError) -> bool:
    """Is ``error`` a server out of reach (worth waiting for), not a refusal for good?"""
    cause = error.__cause__
    text = str(cause)
    return is_outage(error) and not ("FATAL" in text and any(s in text for s in _REFUSED_FOR_GOOD))


def _nothing(conn: Any) -> None:
    """A unit of work that does nothing (what :meth:`Pools.prepare` runs after ``setup``)."""


def table_name(table: object, longest: int) -> str:
    """``table``, if it is a plain lowercase SQL identifier of at most ``longest`` characters.

    It is put into statements as is, and the names derived from it must stay under 63.

    Raises:
        ConfigError: naming ``table``.
    """
    pattern = rf"[a-z_][a-z0-9_]{{0,{longest - 1}}}"
    if not isinstance(table, str) or not re.fullmatch(pattern, table):
        raise ConfigError(f"table: {table!r:.40} is not a plain lowercase identifier")
    return table


T = TypeVar("T")


def positive(name: str, value: float) -> float:
    """``value`` as a float if it is a finite number of seconds > 0, else ConfigError."""
    return seconds(name, value)  # (a huge int made math.isfinite raise OverflowError)


def _dead(conn: Any) -> bool:
    """Whether a pooled connection is unusable (closed, broken, or its server left)."""
    try:
        return bool(conn.closed) or idle_socket_has_data(conn.pgconn.socket)
    except Exception:  # psycopg raises on a closed pgconn's socket
        return True


class _Attempt:
    """The alarm of the work in flight, read when translating its error."""

    alarm: Deadline | None = None


class Pools:
    """A sync pool and per-loop async pools, and the drivers of one unit of work.

    Args:
        dsn: A libpq connection string or URL; the pools are built from it. Give ``dsn``
            or ``pool``.
        pool: An existing ``psycopg_pool.ConnectionPool`` (not closed by :meth:`close`).
        async_pool: An existing ``AsyncConnectionPool`` for async work (not closed by
            :meth:`close`); without it, pools are built like the sync one, one per loop.
        name: Names the pools (and the thing in error messages, ``"postgres"`` if empty).
        setup: Creates, checks or upgrades the tables (:data:`Setup`): at construction
            and, if the server could not be reached then, before the first work; again in
            repair mode when a work finds a table missing.
        timeout: Seconds one unit of work may take, the wait for a connection included.
        connect_timeout: Seconds to establish a connection (libpq rounds up, minimum 2).
        statement_timeout: Server-side limit of one statement, in seconds.
        read_only: Connections built here refuse writes (``default_transaction_read_only``);
            a missing table is not made again.
        wait_for_server: A server out of reach at construction is waited for (the
            default; see the module docstring) instead of raising.
        min_size, max_size, keepalives_idle, application_name: Pool and connection
            settings (see :class:`demote.state.PostgresStateStore`).

    Raises:
        ConfigError: ``dsn`` and ``pool`` are both given or both missing, or a timeout
            is not a finite number > 0.
        MissingExtraError: psycopg is not installed (``demote[postgres]``).
        StoreError: ``setup`` failed in the database; the server refused the connection
            for good; or it cannot be reached and ``wait_for_server`` is off.
    """

    def __init__(
        self,
        dsn: str | None,
        *,
        pool: Any,
        async_pool: Any,
        name: str,
        setup: Setup,
        timeout: float,
        connect_timeout: float,
        statement_timeout: float,
        min_size: int,
        max_size: int,
        keepalives_idle: int,
        application_name: str,
        read_only: bool = False,
        wait_for_server: bool = True,
    ) -> None:
        if (dsn is None) == (pool is None):
            raise ConfigError("give exactly one of dsn and pool")
        if dsn is not None and not isinstance(dsn, str):
            raise ArgumentTypeError(f"dsn: must be a str URL, got {type(dsn).__name__}")
        min_size = count("min_size", min_size, minimum=0, maximum=10_000)
        max_size = count("max_size", max_size, minimum=max(1, min_size), maximum=10_000)
        keepalives_idle = count("keepalives_idle", keepalives_idle, maximum=86_400)
        if not isinstance(application_name, str) or not 0 < len(application_name) <= 63:
            raise ConfigError(
                f"application_name: must be a str of 1 to 63 characters, got "
                f"{application_name!r:.40}"
            )
        if "\x00" in application_name or not application_name.isprintable():
            raise ConfigError(f"application_name: must be printable, got {application_name!r:.40}")
        if not isinstance(read_only, bool):
            raise ArgumentTypeError(f"read_only: must be a bool, got {read_only!r:.40}")
        self.timeout = positive("timeout", timeout)
        statement_ms = round(positive("statement_timeout", statement_timeout) * 1000)
        connect = max(2, math.ceil(positive("connect_timeout", connect_timeout)))
        try:
            import psycopg
            import psycopg_pool
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError("psycopg", "postgres") from exc
        self._errors: tuple[type[BaseException], ...] = (psycopg.Error, OSError)
        self._attempts = max_size + 1
        self.closed = False
        self._owns_pool = pool is None
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": connect,
            "keepalives": 1,
            "keepalives_idle": keepalives_idle,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": round(self.timeout * 1000),
            "application_name": application_name,
        }
        settings = f"SET statement_timeout = {statement_ms}"
        if read_only:
            settings += "; SET default_transaction_read_only = on"

        def configure(conn: Any) -> None:
            conn.execute(settings)

        async def aconfigure(conn: Any) -> None:
            await conn.execute(settings)

        self._setup = setup
        self._read_only = read_only
        self._name = name or "postgres"
        self.ready = False
        try:
            with self._translated(_Attempt(), "cannot reach postgres"):
                if pool is None:
                    with psycopg.connect(dsn or "", **kwargs) as conn:
                        self._prepare(conn, repair=False)
                else:
                    with pool.connection(timeout=self.timeout) as conn:
                        self._prepare(conn, repair=False)
        except StoreError as exc:
            if not (wait_for_server and _unreachable(exc)):
                raise
            logger.warning(
                "%s: %s; built without it: calls fail (loads are degraded) until it answers, "
                "then the tables are made or checked",
                self._name,
                exc,
            )
        if pool is None:
            pool = psycopg_pool.ConnectionPool(
                dsn or "",
                kwargs=kwargs,
                configure=configure,
                min_size=min_size,
                max_size=max_size,
                timeout=self.timeout,
                reconnect_timeout=self.timeout,
                name=name,
                open=True,
            )
        self.pool = pool

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
                reconnect_timeout=self.timeout,
                name=f"{name}-async",
                open=False,
            )
            await made.open()
            return made

        async def close(made: Any) -> None:
            if made is not async_pool:
                await made.close()

        self._async: PerLoop[Any] = PerLoop(make, close)

    @contextmanager
    def _translated(self, attempt: _Attempt, what: str = "postgres") -> Iterator[None]:
        try:
            yield
        except self._errors as exc:  # psycopg errors become ours at this boundary
            if attempt.alarm is not None and attempt.alarm.fired:
                raise StoreError(
                    f"{what}: no reply within {self.timeout:g} s (connection dropped)"
                ) from exc
            detail = " ".join(str(exc).split())  # libpq's messages span lines
            raise StoreError(f"{what}: {type(exc).__name__}: {detail}") from exc

    def _left(self, deadline: float) -> float:
        return max(0.001, deadline - time.monotonic())

    def _check(self, label: str) -> None:
        if self.closed:
            raise StoreError(f"{label} is closed")

    def _prepare(self, conn: Any, repair: bool) -> None:
        """Run ``setup`` on ``conn``: one transaction, with the setup's statement timeout."""
        with conn.transaction():
            conn.execute(f"SET LOCAL statement_timeout = {round(SETUP_SECONDS * 1000)}")
            self._setup(conn, repair)
        if not conn.autocommit:
            conn.commit()
        self.ready = True

    def run(self, work: Callable[[Any], T], label: str = "postgres") -> T:
        """Run ``work(connection)`` on a live pooled connection, within :attr:`timeout`.

        Before the first work (the server was out of reach at construction) ``setup``
        runs; a work that finds a table missing has it made again, and runs once more.
        """
        try:
            return self._attempt(work, label, repair=False)
        except StoreError as exc:
            if self._read_only or not missing_object(exc):
                raise
            missing = exc
        self.repair(label)
        logger.warning("%s: %s; made again (as at first use)", label, missing)
        return self._attempt(work, label, repair=False)

    def _attempt(self, work: Callable[[Any], T], label: str, repair: bool) -> T:
        self._check(label)
        deadline, attempt = time.monotonic() + self.timeout, _Attempt()
        with self._translated(attempt):
            for _ in range(self._attempts):
                with self.pool.connection(timeout=self._left(deadline)) as conn:
                    if _dead(conn):
                        conn.close()  # the pool replaces it
                        continue
                    setup = repair or not self.ready
                    left = max(self._left(deadline), SETUP_SECONDS if setup else 0.0)
                    with thread_deadline(conn.pgconn.socket, left) as alarm:
                        attempt.alarm = alarm
                        if setup:
                            self._prepare(conn, repair)
                        result = work(conn)
                        if not conn.autocommit:
                            conn.commit()
                return result
        raise StoreError(f"postgres: no live connection in {self._attempts} tries")

    def repair(self, label: str = "postgres") -> None:
        """Run ``setup`` in repair mode now: make whatever is missing (idempotent)."""
        self._attempt(_nothing, label, repair=True)

    def prepare(self, label: str = "postgres") -> None:
        """Run ``setup`` now if it has not run yet (the server was out of reach)."""
        if not self.ready:
            self.run(_nothing, label)

    async def aprepare(self, label: str = "postgres") -> None:
        """:meth:`prepare` from a coroutine (on the sync pool, in a worker thread)."""
        if not self.ready:
            await asyncio.to_thread(self.prepare, label)

    async def arun(self, work: Callable[[Any], Awaitable[T]], label: str = "postgres") -> T:
        """:meth:`run` on this event loop's async pool: ``await work(connection)``.

        ``setup`` (first use, repair) runs on the sync pool, in a worker thread.
        """
        await self.aprepare(label)
        try:
            return await self._aattempt(work, label)
        except StoreError as exc:
            if self._read_only or not missing_object(exc):
                raise
            missing = exc
        await asyncio.to_thread(self.repair, label)
        logger.warning("%s: %s; made again (as at first use)", label, missing)
        return await self._aattempt(work, label)

    async def _aattempt(self, work: Callable[[Any], Awaitable[T]], label: str) -> T:
        self._check(label)
        attempt = _Attempt()
        with self._translated(attempt):
            pool = await self._async.get()  # made on this loop's first call, not timed here
            deadline = time.monotonic() + self.timeout
            for _ in range(self._attempts):
                async with pool.connection(timeout=self._left(deadline)) as conn:
                    if _dead(conn):
                        await conn.close()  # the pool replaces it
                        continue
                    with loop_deadline(conn.pgconn.socket, self._left(deadline)) as alarm:
                        attempt.alarm = alarm
                        result = await work(conn)
                        if not conn.autocommit:
                            await conn.commit()
                return result
        raise StoreError(f"postgres: no live connection in {self._attempts} tries")

    def close(self) -> None:
        """Close the pools made here (idempotent); async ones on their loops."""
        if self.closed:
            return
        self.closed = True
        self._async.close_all()
        if self._owns_pool:
            self.pool.close()

    async def aclose(self) -> None:
        """Close this loop's async pool, then everything :meth:`close` closes."""
        await self._async.close_current()
        self.close()


@contextmanager
def transaction(conn: Any, write: bool) -> Iterator[None]:
    """A transaction around the block when ``write``, else nothing (autocommit reads)."""
    if write:
        with conn.transaction():
            yield
    else:
        yield


@asynccontextmanager
async def atransaction(conn: Any, write: bool) -> AsyncIterator[None]:
    """:func:`transaction` on an async connection."""
    if write:
        async with conn.transaction():
            yield
    else:
        yield
