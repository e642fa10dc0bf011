"""A durable state store in one SQLite file (WAL mode, safe across threads and processes).

Schema: one row per conversation in ``demote_state``. Compare-and-set runs inside a
``BEGIN IMMEDIATE`` transaction, so two processes never both commit the same advance.
Conversation ids are only ever bound as query parameters.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import astuple, fields

from demote._closing import Closing
from demote.errors import StoreError
from demote.records import ConversationState
from demote.state.base import Lease, tombstone

__all__ = ["SQLiteStateStore"]

_COLUMNS = [f.name for f in fields(ConversationState)]
_SCHEMA = """
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
)
"""


class SQLiteStateStore(Closing):
    """Conversation states in an SQLite file.

    Args:
        path: The database file (created if missing). ``":memory:"`` works for tests.
        timeout: Seconds to wait for another process's write lock.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(
                self.path, timeout=timeout, check_same_thread=False, isolation_level=None
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open state store {self.path!r}: {exc}") from exc
        self._closed = False

    @contextmanager
    def _tx(self, immediate: bool = False) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise StoreError(f"state store {self.path!r} is closed")
            try:
                self._db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"state store {self.path!r}: {exc}") from exc

    @staticmethod
    def _read(db: sqlite3.Connection, conversation_id: str) -> ConversationState | None:
        row = db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM demote_state WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchone()
        return None if row is None else ConversationState(*row)

    def get(self, conversation_id: str) -> ConversationState | None:
        """The stored state, or ``None``."""
        with self._tx() as db:
            return self._read(db, conversation_id)

    def compare_and_set(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        *,
        lease: Lease | None = None,
        release: bool = False,
    ) -> bool:
        """Store ``new`` if the current state equals ``expected`` (one transaction)."""
        del lease, release  # no leases here (yet)
        with self._tx(immediate=True) as db:
            if self._read(db, conversation_id) != expected:
                return False
            db.execute(
                f"INSERT OR REPLACE INTO demote_state (conversation_id, {', '.join(_COLUMNS)}) "
                f"VALUES (?{', ?' * len(_COLUMNS)})",
                (conversation_id, *astuple(new)),
            )
            return True

    def clear(self, conversation_id: str) -> ConversationState:
        """Leave a tombstone one generation on."""
        with self._tx(immediate=True) as db:
            tomb = tombstone(self._read(db, conversation_id))
            db.execute(
                f"INSERT OR REPLACE INTO demote_state (conversation_id, {', '.join(_COLUMNS)}) "
                f"VALUES (?{', ?' * len(_COLUMNS)})",
                (conversation_id, *astuple(tomb)),
            )
            return tomb

    def delete(self, conversation_id: str) -> None:
        """Forget the conversation's state."""
        with self._tx(immediate=True) as db:
            db.execute("DELETE FROM demote_state WHERE conversation_id = ?", (conversation_id,))

    def count(self) -> int:
        """How many conversations have state."""
        with self._tx() as db:
            (n,) = db.execute("SELECT COUNT(*) FROM demote_state").fetchone()
            return int(n)

    def conversations(self) -> list[str]:
        """Ids of the conversations with state, sorted."""
        with self._tx() as db:
            rows = db.execute("SELECT conversation_id FROM demote_state ORDER BY 1").fetchall()
            return [r[0] for r in rows]

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
