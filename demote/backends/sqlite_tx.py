"""One SQLite write transaction, as every demote store on SQLite takes it.

``BEGIN IMMEDIATE`` takes the file's write lock at once (waiting up to the connection's
``busy_timeout``), so two writers never both read and then fail to upgrade; the block's
work is committed when it ends and rolled back when it raises, whatever it raises.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["immediate"]


@contextmanager
def immediate(db: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
    """Run the block in one write transaction on ``db`` (``begin`` starts it)."""
    db.execute(begin)
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
