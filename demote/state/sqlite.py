"""A durable state store in one SQLite file (WAL mode, safe across threads and processes).

Schema (version 4, in ``PRAGMA user_version``; ``PRAGMA application_id`` marks the file as
demote's): one row per conversation in ``demote_state``, one per held lease in
``demote_lease`` (holder, fencing token, expiry in wall-clock seconds, so processes on one
host agree), and the store-wide fencing counter in ``demote_fence``, which clear and
delete never touch. A file of version 1 (``demote_state`` alone) is migrated in place on
open and keeps its states; a file of a newer version is refused. A table dropped from a
file (by hand, by a tool) is made again at the newest layout by the first operation that
finds it missing, which is then run once more, as at first use; a warning says so.

Every write (compare-and-set, lease, clear, delete) is one ``BEGIN IMMEDIATE``
transaction, so the lease check, the comparison, the write and the release happen as one
step across processes. Reads are one statement. Conversation ids are only ever bound as
query parameters.

A row that is not a state (a column of the wrong type, a negative index) is never
guessed at: reading it raises :class:`~demote.errors.StoreError`, so the conversation's
loads fail loudly. ``clear`` (``Demoter.clear``) repairs it, replacing it with a
tombstone (its generation restarts at 1 if the stored one is unreadable), and ``delete``
(``forget``, ``erase``) removes it: a corrupt row never leaves a conversation stuck.

Erase: the connection runs with ``secure_delete`` on, so a deleted state (its summary,
its id) is overwritten in the file rather than left in free space, and a delete (what
:meth:`demote.Demoter.erase` and ``forget`` call) ends with a ``TRUNCATE`` checkpoint, so
it does not survive in the WAL either.

The async twins run the sync methods on the store's own single worker thread (not the
event loop's default executor): a call takes tens of microseconds, the thread keeps them
off the loop all the same.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import astuple
from functools import cache
from typing import TypeVar

from demote._validate import file_path, seconds
from demote.backends.sqlite_kind import Columns, check_kind, connect, declare, schema_columns
from demote.backends.sqlite_tx import immediate
from demote.backends.wal import truncate_wal
from demote.backends.worker import Worker
from demote.errors import ArgumentTypeError, StoreError
from demote.records import ConversationState
from demote.state._codec import COLUMNS, check_ttl, state_from_row, storable_id
from demote.state._ops import OpStore, StoreOp
from demote.state.base import Lease, tombstone

__all__ = ["SQLiteStateStore"]

T = TypeVar("T")
logger = logging.getLogger("demote")
_WRITE = "BEGIN IMMEDIATE"

_OWN_TABLES = ("demote_state", "demote_lease", "demote_fence")

#: ``PRAGMA application_id``: "demo" in ASCII.
APPLICATION_ID = 0x64656D6F
#: The schema version this code writes (``PRAGMA user_version``).
SCHEMA_VERSION = 4

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE IF NOT EXISTS demote_state (
        conversation_id TEXT PRIMARY KEY,
        window_start INTEGER NOT NULL,
        delivered INTEGER NOT NULL,
        pinned INTEGER NOT NULL,
        anchor TEXT,
        summary TEXT,
        summarized INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        generation INTEGER NOT NULL
    );
    """,
    2: """
    CREATE TABLE IF NOT EXISTS demote_lease (
        conversation_id TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        token INTEGER NOT NULL,
        expires REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS demote_fence (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        last INTEGER NOT NULL
    );
    INSERT OR IGNORE INTO demote_fence (id, last) VALUES (0, 0);
    """,
    3: """
    ALTER TABLE demote_state ADD COLUMN trail TEXT NOT NULL DEFAULT '';
    """,
    4: """
    ALTER TABLE demote_state ADD COLUMN cleared INTEGER NOT NULL DEFAULT 0;
    """,
}


@cache
def newest_tables() -> dict[str, str]:
    """Each table's ``CREATE`` statement at :data:`SCHEMA_VERSION`.

    The migrations replayed on a scratch in-memory database, so the newest layout is
    never written twice.
    """
    scratch = sqlite3.connect(":memory:")
    try:
        for version in sorted(_MIGRATIONS):
            scratch.executescript(_MIGRATIONS[version])
        rows = scratch.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
        return {str(name): str(sql) for name, sql in rows}
    finally:
        scratch.close()


def _missing_table(error: StoreError) -> bool:
    cause = error.__cause__
    return isinstance(cause, sqlite3.OperationalError) and "no such table" in str(cause)


def _declared() -> Columns:
    """Each table's columns: those of version 1 at least, those of the newest at most."""
    newest = schema_columns(_MIGRATIONS[v] for v in sorted(_MIGRATIONS))
    first = schema_columns([_MIGRATIONS[1]])
    return {table: (first.get(table, cols), cols) for table, cols in newest.items()}


declare(APPLICATION_ID, _declared)

_SELECT = f"SELECT {', '.join(COLUMNS)} FROM demote_state WHERE conversation_id = ?"
_UPSERT = (
    f"INSERT OR REPLACE INTO demote_state (conversation_id, {', '.join(COLUMNS)}) "
    f"VALUES (?{', ?' * len(COLUMNS)})"
)
_HOLDS = (
    "SELECT 1 FROM demote_lease WHERE conversation_id = ? AND holder = ? AND token = ? "
    "AND expires > ?"
)
_DROP_LEASE = "DELETE FROM demote_lease WHERE conversation_id = ? AND holder = ? AND token = ?"


def _op(
    begin: str | None,
    work: Callable[[sqlite3.Connection], T],
    after: Callable[[sqlite3.Connection], object] | None = None,
) -> StoreOp[T]:
    """``work`` on the connection, in a write transaction if ``begin``, else as is.

    ``after`` runs once that is committed (outside the transaction).
    """
    return StoreOp((begin, work, after), _same)


def _same(result: T) -> T:
    return result


class SQLiteStateStore(OpStore):
    """Conversation states and fenced leases in an SQLite file.

    Args:
        path: The database file (created if missing). ``":memory:"`` works for tests.
        timeout: Seconds to wait for another process's write lock.
        clock: Wall-clock seconds; leases expire by it. Every process sharing the file
            must use the same clock (the default, :func:`time.time`, is right).
        read_only: Open an existing store without ever writing to it (``demote
            inspect``): the file must exist and be at the current schema, and every write
            raises :class:`~demote.errors.StoreError`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
    ) -> None:
        timeout = seconds("timeout", timeout, zero=True)
        self.path = file_path("state store path", path)
        if not isinstance(read_only, bool):
            raise ArgumentTypeError(f"read_only: must be a bool, got {read_only!r:.40}")
        self.read_only = read_only
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        self._worker = Worker(f"demote-sqlite-state:{os.path.basename(self.path)}")
        try:
            self._db = connect(self.path, timeout, read_only=read_only, kind=APPLICATION_ID)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open state store {self.path!r}: {exc}") from exc
        try:
            # Whose file it is comes first: switching a foreign file to WAL writes to it.
            check_kind(self._db, self.path, APPLICATION_ID, _OWN_TABLES)
            if read_only:
                self._check_current()
                return
            self._wal(timeout)
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA secure_delete=ON")  # deleted rows leave no bytes
            self._migrate()
        except BaseException as exc:
            self._db.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"cannot open state store {self.path!r}: {exc}") from exc
            raise

    def _wal(self, timeout: float) -> None:
        """Switch to WAL, waiting up to ``timeout`` for another process doing the same.

        SQLite answers "locked" at once there, without its busy handler.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)

    def _migrate(self) -> None:
        """Bring the file to :data:`SCHEMA_VERSION` (one transaction; no-op if there)."""
        if self._versions() == (APPLICATION_ID, SCHEMA_VERSION):
            return
        self._db.execute("BEGIN IMMEDIATE")  # re-read under the lock: another process may win
        try:
            _, version = self._versions()
            check_kind(self._db, self.path, APPLICATION_ID, _OWN_TABLES)
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path!r} has state store schema {version}, newer than this "
                    f"demote's {SCHEMA_VERSION}: upgrade demote"
                )
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[step].split(";"):
                    if statement.strip():
                        self._db.execute(statement)
            self._db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _check_current(self) -> None:
        """A read-only open reads only a file at this code's schema (it cannot migrate)."""
        if self._versions() != (APPLICATION_ID, SCHEMA_VERSION):
            _, version = self._versions()
            raise StoreError(
                f"{self.path!r} is not a demote state store at schema {SCHEMA_VERSION} "
                f"(found {version}): open it read-write once to migrate it"
            )

    def _versions(self) -> tuple[int, int]:
        (app,) = self._db.execute("PRAGMA application_id").fetchone()
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        return int(app), int(version)

    @contextmanager
    def _tx(self, begin: str | None = "BEGIN IMMEDIATE") -> Iterator[sqlite3.Connection]:
        """The connection, under the lock; in a write transaction unless ``begin`` is None."""
        with self._lock:
            if self._closed:
                raise StoreError(f"state store {self.path!r} is closed")
            db = self._db
            if begin is not None and self.read_only:
                raise StoreError(f"state store {self.path!r} was opened read-only")
            try:
                if begin is None:
                    yield db
                    return
                with immediate(db, begin):
                    yield db
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise StoreError(f"state store {self.path!r}: {exc}") from exc

    @staticmethod
    def _read(db: sqlite3.Connection, conversation_id: str) -> ConversationState | None:
        row = db.execute(_SELECT, (conversation_id,)).fetchone()
        return None if row is None else state_from_row(row)

    # The operations: what runs in which transaction. _run performs one under the lock;
    # _arun on the store's own thread.

    def _run(self, op: StoreOp[T]) -> T:
        try:
            return self._run_once(op)
        except StoreError as exc:
            if self.read_only or not _missing_table(exc):
                raise
            missing = exc
        self._repair()
        logger.warning("%s; made again (as at first use)", missing)
        return self._run_once(op)

    def _run_once(self, op: StoreOp[T]) -> T:
        begin, work, after = op.request
        with self._tx(begin) as db:
            result = op.finish(work(db))
        if after is not None:
            with self._tx(None) as db:
                after(db)
        return result

    def _repair(self) -> None:
        """Make the tables that went missing again, at the newest layout (one transaction).

        A fencing counter made again starts at the clock in milliseconds: its tokens
        must only grow, and the archive and outbox remember erases' tokens.
        """
        with self._tx() as db:
            have = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for table, create in newest_tables().items():
                if table not in have:
                    db.execute(create)
                    if table == "demote_fence":
                        db.execute(
                            "INSERT INTO demote_fence (id, last) VALUES (0, ?)",
                            (int(time.time() * 1000),),
                        )

    async def _arun(self, op: StoreOp[T]) -> T:
        return await self._worker.run(self._run, op)

    def _get_op(self, conversation_id: str) -> StoreOp[ConversationState | None]:
        cid = storable_id(conversation_id)
        return _op(None, lambda db: self._read(db, cid))

    def _cas_op(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        lease: Lease | None,
        release: bool,
    ) -> StoreOp[bool]:
        cid = storable_id(conversation_id)

        def cas(db: sqlite3.Connection) -> bool:
            ok = self._read(db, cid) == expected and (
                lease is None
                or db.execute(_HOLDS, (cid, lease.holder, lease.token, self._clock())).fetchone()
                is not None
            )
            if ok:
                db.execute(_UPSERT, (cid, *astuple(new)))
            if release and lease is not None:
                db.execute(_DROP_LEASE, (cid, lease.holder, lease.token))
            return ok

        return _op(_WRITE, cas)

    def _clear_op(self, conversation_id: str) -> StoreOp[ConversationState]:
        cid = storable_id(conversation_id)

        def clear(db: sqlite3.Connection) -> ConversationState:
            # Only the generation is read: clearing repairs a corrupt row, whose reads raise
            # StoreError (a corrupt generation starts over, as a never-seen one does).
            row = db.execute(
                "SELECT generation FROM demote_state WHERE conversation_id = ?", (cid,)
            ).fetchone()
            readable = row is not None and type(row[0]) is int and row[0] >= 0
            tomb = tombstone(ConversationState(generation=row[0]) if readable else None)
            db.execute(_UPSERT, (cid, *astuple(tomb)))
            db.execute("DELETE FROM demote_lease WHERE conversation_id = ?", (cid,))
            return tomb

        return _op(_WRITE, clear)

    def _delete_op(self, conversation_id: str) -> StoreOp[None]:
        cid = storable_id(conversation_id)

        def delete(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM demote_state WHERE conversation_id = ?", (cid,))
            db.execute("DELETE FROM demote_lease WHERE conversation_id = ?", (cid,))

        return _op(_WRITE, delete, truncate_wal)  # the deleted bytes leave the WAL too

    def _count_op(self) -> StoreOp[int]:
        return _op(
            None, lambda db: int(db.execute("SELECT COUNT(*) FROM demote_state").fetchone()[0])
        )

    def _acquire_op(self, conversation_id: str, holder: str, ttl: float) -> StoreOp[Lease | None]:
        cid, seconds = storable_id(conversation_id), check_ttl(ttl)

        def acquire(db: sqlite3.Connection) -> Lease | None:
            now = self._clock()
            held = db.execute(
                "SELECT 1 FROM demote_lease WHERE conversation_id = ? AND expires > ?", (cid, now)
            ).fetchone()
            if held is not None:
                return None
            (token,) = db.execute(
                "UPDATE demote_fence SET last = last + 1 WHERE id = 0 RETURNING last"
            ).fetchone()
            db.execute(
                "INSERT OR REPLACE INTO demote_lease (conversation_id, holder, token, expires) "
                "VALUES (?, ?, ?, ?)",
                (cid, holder, token, now + seconds),
            )
            return Lease(cid, holder, int(token), self._read(db, cid))

        return _op(_WRITE, acquire)

    def _renew_op(self, lease: Lease, ttl: float) -> StoreOp[bool]:
        cid, seconds = storable_id(lease.conversation_id), check_ttl(ttl)

        def renew(db: sqlite3.Connection) -> bool:
            now = self._clock()
            cur = db.execute(
                "UPDATE demote_lease SET expires = ? WHERE conversation_id = ? AND holder = ? "
                "AND token = ? AND expires > ?",
                (now + seconds, cid, lease.holder, lease.token, now),
            )
            return cur.rowcount == 1

        return _op(_WRITE, renew)

    def _release_op(self, lease: Lease) -> StoreOp[None]:
        cid = storable_id(lease.conversation_id)

        def release(db: sqlite3.Connection) -> None:
            db.execute(_DROP_LEASE, (cid, lease.holder, lease.token))

        return _op(_WRITE, release)

    def _conversations_op(self) -> StoreOp[list[str]]:
        def ids(db: sqlite3.Connection) -> list[str]:
            rows = db.execute("SELECT conversation_id FROM demote_state ORDER BY 1").fetchall()
            return [r[0] for r in rows]

        return _op(None, ids)

    def ensure_schema(self) -> None:
        """Create or upgrade the tables now, and make again any that is missing.

        Idempotent; what ``demote migrate`` runs ahead of a deployment (opening the
        store already migrates it; this also makes dropped tables again).

        Raises:
            StoreError: The store was opened read-only, or the file cannot be written.
        """
        self._repair()

    def close(self) -> None:
        """Close the connection and stop the worker thread (idempotent)."""
        self._worker.close()
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
