"""The SQLite archive's one connection behind its lock: open, read-only, closed.

:class:`~demote.archive.sqlite.SQLiteArchive` shares one connection (WAL mode,
``busy_timeout``) among every thread that uses it; :class:`Guarded` is that sharing. A
read or a transaction holds the lock, refuses a closed archive, and translates SQLite's
errors into :class:`~demote.errors.StoreError` naming what was being done; a
transaction (``BEGIN IMMEDIATE``) is refused by an archive opened read-only and rolled
back by any exception.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from demote.backends.sqlite_tx import immediate
from demote.errors import StoreError

__all__ = ["Guarded"]


class Guarded:
    """A connection, its lock, and whether it is closed or read-only."""

    def __init__(self, db: sqlite3.Connection, read_only: bool) -> None:
        self.db = db
        self.read_only = read_only
        self.lock = threading.RLock()
        self.closed = False

    @contextmanager
    def locked(self, what: str) -> Iterator[sqlite3.Connection]:
        """Hold the lock and translate backend errors into :class:`StoreError`."""
        with self.lock:
            if self.closed:
                raise StoreError(f"cannot {what}: the archive is closed")
            try:
                yield self.db
            except sqlite3.Error as exc:
                raise StoreError(f"cannot {what}: {exc}") from exc

    @contextmanager
    def transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """:meth:`locked`, in a write transaction (refused when read-only)."""
        if self.read_only:
            raise StoreError(f"cannot {what}: the archive is open read-only")
        with self.locked(what) as db, immediate(db):
            yield db

    def close(self) -> None:
        """Close the connection; further uses raise :class:`StoreError`. Idempotent."""
        with self.lock:
            if not self.closed:
                self.closed = True
                self.db.close()
