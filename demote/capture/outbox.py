"""A durable outbox for the Recorder, in one SQLite file.

Theory of operation: ``enqueue`` writes the item here first (one small INSERT and commit),
the worker delivers it, then deletes the row. A process killed at any moment (``kill -9``)
leaves undelivered rows behind, and the next Recorder started on the same file delivers
them before anything new: delivery is at-least-once, and every row carries the item's dedup
key so sinks can drop a repeat (the one that was delivered but not yet deleted).

A failed delivery stays in the table with its attempt count and last error; the Recorder
retries it with exponential backoff (:class:`~demote.capture.RetryPolicy`). After the last
attempt the row moves to the ``dead_letters`` table in the same transaction, where
:meth:`SQLiteOutbox.dead_letters` lists it and :meth:`SQLiteOutbox.replay_dead_letters`
puts it back in line.

Durability: the file runs in WAL mode. ``synchronous="NORMAL"`` (the default) fsyncs only
at checkpoints, so a committed item survives any crash of the *process* (kill -9, OOM,
segfault) but the last few commits can roll back on an OS crash or power loss.
``synchronous="FULL"`` fsyncs every commit and survives those too, at a cost of one fsync
per ``enqueue`` (milliseconds on most disks, against tens of microseconds).

Use one Recorder per outbox file at a time: a second Recorder started on the same file
would take the first one's queued rows for leftovers and deliver them too (harmless for
idempotent sinks, but wasted work). ``sqlite3`` errors surface as
:class:`~demote.errors.StoreError`.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from os import PathLike
from typing import Any, Literal

from demote._closing import Closing
from demote.capture.codec import decode
from demote.capture.dispatch import RetryPolicy
from demote.errors import ConfigError, StoreError

__all__ = ["DeadLetter", "OutboxRow", "SQLiteOutbox"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    error TEXT,
    created_at REAL NOT NULL,
    failed_at REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One undelivered item as stored: row id, dedup key, payload, failed attempts."""

    id: int
    key: str
    payload: str
    attempts: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An item that failed every attempt.

    Attributes:
        key: Its dedup key.
        item: The item, read back (a ``Demotion`` has ``raw=None`` on every message).
        attempts: How many deliveries were tried.
        error: The last error, as ``"Type: message"``.
        failed_at: When it was given up on (Unix time).
    """

    key: str
    item: Any
    attempts: int
    error: str | None
    failed_at: float


@contextmanager
def _translated(path: str, action: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"outbox {path!r}: {action} failed: {exc}") from exc


class SQLiteOutbox(Closing):
    """A durable outbox in a SQLite file (created if missing).

    Safe to share between the threads of one process (one connection behind a lock).

    Args:
        path: The database file (``":memory:"`` works but survives nothing).
        retry: Attempts and backoff for failed items; defaults to 5 attempts, 0.5 s base.
        synchronous: ``"NORMAL"`` (survives process crashes) or ``"FULL"`` (also power
            loss); see the module docstring.

    Raises:
        ConfigError: ``synchronous`` is not one of the two.
        StoreError: The file cannot be opened or is not an outbox.
    """

    def __init__(
        self,
        path: str | PathLike[str],
        *,
        retry: RetryPolicy | None = None,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ConfigError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        self.path = str(path)
        self.retry = retry if retry is not None else RetryPolicy()
        self._lock = threading.Lock()
        with _translated(self.path, "open"):
            self._db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=30
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the connection (rows stay in the file). Idempotent."""
        with self._lock, _translated(self.path, "close"):
            self._db.close()

    def put(self, key: str, payload: str) -> int:
        """Store one item durably; returns its row id."""
        with self._lock, _translated(self.path, "put"):
            cur = self._db.execute(
                "INSERT INTO outbox (key, payload, created_at) VALUES (?, ?, ?)",
                (key, payload, time.time()),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def ack(self, row: int) -> None:
        """Forget a delivered item."""
        with self._lock, _translated(self.path, "ack"):
            self._db.execute("DELETE FROM outbox WHERE id = ?", (row,))

    def fail(self, row: int, attempts: int, error: str | None) -> None:
        """Record a failed attempt of an item that will be retried."""
        with self._lock, _translated(self.path, "fail"):
            self._db.execute(
                "UPDATE outbox SET attempts = ?, last_error = ? WHERE id = ?",
                (attempts, error, row),
            )

    def bury(self, row: int, attempts: int, error: str | None) -> None:
        """Move an item that failed its last attempt to the dead letters."""
        with self._lock, _translated(self.path, "bury"), self._transaction():
            self._db.execute(
                "INSERT INTO dead_letters (key, payload, attempts, error, created_at, failed_at)"
                " SELECT key, payload, ?, ?, created_at, ? FROM outbox WHERE id = ?",
                (attempts, error, time.time(), row),
            )
            self._db.execute("DELETE FROM outbox WHERE id = ?", (row,))

    def load(self) -> list[OutboxRow]:
        """Every undelivered item, oldest first (what a starting Recorder delivers)."""
        with self._lock, _translated(self.path, "load"):
            rows = self._db.execute(
                "SELECT id, key, payload, attempts FROM outbox ORDER BY id"
            ).fetchall()
        return [OutboxRow(*row) for row in rows]

    def pending(self) -> int:
        """How many items wait for delivery (queued or in backoff)."""
        with self._lock, _translated(self.path, "pending"):
            (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        return int(count)

    def dead_letters(self) -> list[DeadLetter]:
        """The items that failed every attempt, oldest first."""
        with self._lock, _translated(self.path, "dead_letters"):
            rows = self._db.execute(
                "SELECT key, payload, attempts, error, failed_at FROM dead_letters ORDER BY id"
            ).fetchall()
        return [
            DeadLetter(key=key, item=decode(payload), attempts=attempts, error=err, failed_at=at)
            for key, payload, attempts, err, at in rows
        ]

    def replay_dead_letters(self) -> int:
        """Put every dead letter back in line with a fresh attempt count.

        The next Recorder started on this outbox delivers them; a running Recorder takes
        them at once through :meth:`~demote.capture.Recorder.replay_dead_letters`.

        Returns:
            How many items were put back.
        """
        return len(self.revive())

    def revive(self) -> list[OutboxRow]:
        """Move the dead letters back into the outbox; returns the new rows."""
        with self._lock, _translated(self.path, "replay_dead_letters"), self._transaction():
            first = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM outbox").fetchone()[0]
            self._db.execute(
                "INSERT INTO outbox (key, payload, attempts, created_at)"
                " SELECT key, payload, 0, created_at FROM dead_letters ORDER BY id"
            )
            self._db.execute("DELETE FROM dead_letters")
            rows = self._db.execute(
                "SELECT id, key, payload, attempts FROM outbox WHERE id > ? ORDER BY id",
                (first,),
            ).fetchall()
        return [OutboxRow(*row) for row in rows]

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
