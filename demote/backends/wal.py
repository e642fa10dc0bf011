"""Truncating a SQLite WAL after an erase, so erased bytes do not survive in it.

A ``TRUNCATE`` checkpoint copies every WAL frame back into the database file and then
truncates the WAL to zero bytes. It cannot finish while another connection (a reader in
another process, the outbox's checkpoint thread) still uses the WAL: SQLite reports it
busy, and it is retried for a while before giving up.
"""

from __future__ import annotations

import sqlite3
import time

__all__ = ["truncate_wal"]

#: Seconds a busy TRUNCATE checkpoint is retried before giving up.
PATIENCE = 1.0


def truncate_wal(db: sqlite3.Connection, patience: float | None = None) -> None:
    """Checkpoint ``db``'s WAL and truncate it to zero bytes (no-op outside WAL mode).

    ``patience`` defaults to :data:`PATIENCE` (read at each call).

    Raises:
        sqlite3.OperationalError: Still busy after ``patience`` seconds: the erased rows
            are deleted, but their bytes may remain in the WAL until a later checkpoint.
    """
    deadline = time.monotonic() + (PATIENCE if patience is None else patience)
    while True:
        busy, wal, done = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if not busy:
            return
        if time.monotonic() >= deadline:
            raise sqlite3.OperationalError(
                f"the WAL could not be truncated (busy; {done} of {wal} pages copied): "
                "erased bytes may remain in it until the next checkpoint"
            )
        time.sleep(0.01)
