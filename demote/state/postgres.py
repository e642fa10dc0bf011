"""A state store in PostgreSQL, for several workers or hosts (extra ``demote[postgres]``).

One row per conversation in ``table`` (default ``demote_state``), one per held lease in
``{table}_lease`` (holder, fencing token, expiry by the server's clock), fencing tokens
from the sequence ``{table}_fence``, the schema version in ``{table}_meta``. Tables of
earlier releases are migrated in place when the store opens (see ``_pg_sql``).

Every operation is one SQL statement, so one round trip on the pool's autocommit
connections; the statements are written once (``_pg_sql.Sql``) and executed by a sync
driver over a ``psycopg_pool.ConnectionPool`` and an async one over an
``AsyncConnectionPool`` (one per event loop), both built from the same settings.

Failure handling, for a fleet (:class:`demote.backends.postgres.Pools`, shared with the PostgreSQL
archive):

- connections have a connect timeout, a server-side ``statement_timeout``, TCP
  keepalives and ``tcp_user_timeout``;
- each operation has a client-side deadline (``timeout``) covering the wait for a pooled
  connection and the round trip: a black-holed connection is shut down when it passes
  and the call fails with :class:`StoreError`;
- a pooled connection whose server went away (``pg_terminate_backend``, a restart, a cut
  proxy) is noticed before use without a round trip (its idle socket turned readable)
  and replaced, so the store recovers with no process restart;
- a pool that cannot connect gives up its background retries within ``timeout`` and
  connects again on the next call, instead of backing off for seconds: recovery follows
  the engine's breaker, whose probes are at most 0.6 s apart;
- a server out of reach when the store is made does not stop it being made: its calls
  fail until the server answers, and the first that reaches it makes or checks the
  tables; a table or the sequence dropped while the store runs is made again by the next
  call that finds it missing (:mod:`demote.backends.postgres`).

Every psycopg error becomes a :class:`StoreError` at this boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from demote.backends.postgres import Pools, table_name
from demote.errors import StoreError
from demote.records import ConversationState
from demote.state._codec import check_ttl, state_from_row, storable_id
from demote.state._ops import OpStore, StoreOp
from demote.state._pg_sql import SCHEMA_VERSION, Sql, migrate, schema_version
from demote.state.base import Lease, check_holder

__all__ = ["PostgresStateStore"]

T = TypeVar("T")
Rows = list[tuple[Any, ...]]
_LABEL = "postgres state store"


def _op(sql: str, params: dict[str, Any], finish: Callable[[Rows], T]) -> StoreOp[T]:
    """One statement and how to read its rows."""
    return StoreOp((sql, params), finish)


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
            Short by default: every operation is one single-row statement, and a load
            whose store does not answer degrades (see :mod:`demote.backends.breaker`), so the
            slowest turn during an outage costs about this.
        connect_timeout: Seconds to establish a connection (libpq rounds up, minimum 2).
        statement_timeout: Server-side limit of one statement, in seconds.
        min_size: Connections each pool keeps open.
        max_size: Connections each pool may open.
        keepalives_idle: Seconds of idleness before TCP keepalive probes start.
        application_name: Shown in ``pg_stat_activity`` (name each worker to find its
            sessions).
        read_only: Open an existing store for reading only (what ``demote inspect``
            does): nothing is created or migrated, the connections refuse writes, the
            table must be at this schema, and a server out of reach raises at once.

    Raises:
        StoreError: The table holds a newer schema, or another program's table; the
            server refused the connection for good; read-only: the server is out of
            reach, or the table is missing or older. (A writable store made while its
            server is out of reach is built: see :mod:`demote.backends.postgres`.)
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: Any = None,
        async_pool: Any = None,
        table: str = "demote_state",
        timeout: float = 0.5,
        connect_timeout: float = 2.0,
        statement_timeout: float = 0.5,
        min_size: int = 1,
        max_size: int = 10,
        keepalives_idle: int = 30,
        application_name: str = "demote",
        read_only: bool = False,
    ) -> None:
        self.table = table_name(table, 51)  # the pools check the other options
        self.read_only = read_only
        self._sql = Sql(table)
        self._pools = Pools(
            dsn,
            pool=pool,
            async_pool=async_pool,
            name=f"postgres state store {table!r}",
            setup=self._check_current if read_only else self._migrate,
            read_only=read_only,
            wait_for_server=not read_only,
            timeout=timeout,
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
            min_size=min_size,
            max_size=max_size,
            keepalives_idle=keepalives_idle,
            application_name=application_name,
        )
        self.timeout = self._pools.timeout

    def _migrate(self, conn: Any, repair: bool = False) -> None:
        """Create or upgrade the tables to :data:`SCHEMA_VERSION` (one transaction).

        With ``repair``, every statement runs even if the recorded version is current:
        a table or the sequence dropped since is made again, as at first use.
        """
        migrate(conn, self._sql, repair)

    def _check_current(self, conn: Any, repair: bool = False) -> None:
        """A read-only open reads only a table at this code's schema (it cannot migrate)."""
        version = schema_version(conn, self._sql)
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"no state store in table {self.table!r}"
                if version is None
                else f"table {self.table!r} has state store schema {version}, not "
                f"{SCHEMA_VERSION}: open it once for writing to migrate it"
            )

    def ensure_schema(self) -> None:
        """Create or upgrade the tables now, and make again any that is missing.

        Idempotent; what ``demote migrate`` runs ahead of a deployment. A store does it
        by itself on first use and when it finds a table missing.

        Raises:
            StoreError: The server cannot be reached, the table holds a newer schema or
                another program's table, or the store is read-only.
        """
        if self.read_only:
            raise StoreError(f"state store table {self.table!r} was opened read-only")
        self._pools.repair()

    def _run(self, op: StoreOp[T]) -> T:
        def work(conn: Any) -> Rows:
            cur = conn.execute(*op.request)
            return cur.fetchall() if cur.description else []

        return op.finish(self._pools.run(work, _LABEL))

    async def _arun(self, op: StoreOp[T]) -> T:
        async def work(conn: Any) -> Rows:
            cur = await conn.execute(*op.request)
            return await cur.fetchall() if cur.description else []

        return op.finish(await self._pools.arun(work, _LABEL))

    # The operations, described once; _run and _arun perform them.

    def _get_op(self, conversation_id: str) -> StoreOp[ConversationState | None]:
        def finish(rows: Rows) -> ConversationState | None:
            return state_from_row(rows[0]) if rows else None

        return _op(self._sql.get, {"id": storable_id(conversation_id)}, finish)

    def _count_op(self) -> StoreOp[int]:
        return _op(self._sql.count, {}, lambda rows: int(rows[0][0]))

    def _conversations_op(self) -> StoreOp[list[str]]:
        sql = f'SELECT conversation_id FROM {self.table} ORDER BY conversation_id COLLATE "C"'
        return _op(sql, {}, lambda rows: [str(r[0]) for r in rows])

    def _cas_op(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        lease: Lease | None,
        release: bool,
    ) -> StoreOp[bool]:
        cid = storable_id(conversation_id)
        release = release and lease is not None
        sql = self._sql.cas(expected is not None, lease is not None, release)
        params = self._sql.cas_params(cid, expected, new, lease)
        return _op(sql, params, lambda rows: rows[0][0] == 1)

    def _clear_op(self, conversation_id: str) -> StoreOp[ConversationState]:
        params = self._sql.clear_params(storable_id(conversation_id))
        return _op(self._sql.clear, params, lambda rows: state_from_row(rows[0]))

    def _delete_op(self, conversation_id: str) -> StoreOp[None]:
        return _op(self._sql.delete, {"id": storable_id(conversation_id)}, lambda rows: None)

    def _acquire_op(self, conversation_id: str, holder: str, ttl: float) -> StoreOp[Lease | None]:
        cid = storable_id(conversation_id)

        def finish(rows: Rows) -> Lease | None:
            if not rows:
                return None
            token, *row = rows[0]
            state = None if row[0] is None else state_from_row(row)
            return Lease(cid, holder, int(token), state)

        params = {"id": cid, "holder": holder, "ttl": check_ttl(ttl)}
        return _op(self._sql.acquire, params, finish)

    def _renew_op(self, lease: Lease, ttl: float) -> StoreOp[bool]:
        params = {
            "id": storable_id(lease.conversation_id),
            "holder": lease.holder,
            "token": lease.token,
            "ttl": check_ttl(ttl),
        }
        return _op(self._sql.renew, params, lambda rows: bool(rows))

    def _release_op(self, lease: Lease) -> StoreOp[None]:
        cid = storable_id(lease.conversation_id)
        params = {"id": cid, "holder": lease.holder, "token": lease.token}
        return _op(self._sql.release, params, lambda rows: None)

    def _release_holder_op(self, conversation_id: str, holder: str) -> StoreOp[None]:
        sql = (
            f"DELETE FROM {self._sql.lease_table} WHERE conversation_id = %(id)s "
            "AND holder = %(holder)s"
        )
        params = {"id": storable_id(conversation_id), "holder": check_holder(holder)}
        return _op(sql, params, lambda rows: None)

    def release_holder(self, conversation_id: str, holder: str) -> None:
        """Give back the conversation's lease if ``holder`` holds it, whatever its token.

        For a grant whose reply was lost (the connection dropped after the server took
        the lease): the engine knows only the holder name it asked with.
        """
        self._run(self._release_holder_op(conversation_id, holder))

    async def arelease_holder(self, conversation_id: str, holder: str) -> None:
        """Async :meth:`release_holder`."""
        await self._arun(self._release_holder_op(conversation_id, holder))

    def close(self) -> None:
        """Close the pools this store made (idempotent); async ones on their loops."""
        self._pools.close()

    async def aclose(self) -> None:
        """Close this loop's async pool, then everything :meth:`close` closes."""
        await self._pools.aclose()
