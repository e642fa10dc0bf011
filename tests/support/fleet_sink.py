"""The shared side of the engine fleet tests: the histories every worker sees, and the sink.

A history is a deterministic function of its conversation, *epoch* (bumped when a worker
clears it) and length; the current epoch and length of each conversation live in the sink
file (:class:`Sink`), with every delivered key (worker and fencing token included, no
unique constraint, so a duplicate is a second row), the hook calls and the loads.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from demote import Demotion
from demote.records import fingerprint, make_key

#: The first messages of a history differ between epochs, the rest are the same words in
#: every epoch: a new history can then match a cleared one at its old window start, the
#: case in which a stale commit after a clear used to hide messages (issue 13).
OPENING = 4

SCHEMA = """
CREATE TABLE IF NOT EXISTS history (cid TEXT PRIMARY KEY, epoch INT, length INT);
CREATE TABLE IF NOT EXISTS delivered (
    worker TEXT, cid TEXT, idx INT, key TEXT, fence INT, at REAL);
CREATE TABLE IF NOT EXISTS refused (worker TEXT, cid TEXT, fence INT, highest INT, at REAL);
CREATE TABLE IF NOT EXISTS fences (cid TEXT PRIMARY KEY, highest INT);
CREATE TABLE IF NOT EXISTS calls (
    worker TEXT, cid TEXT, fence INT, lo INT, hi INT, entered REAL, left REAL, ok INT);
CREATE TABLE IF NOT EXISTS loads (
    worker TEXT, cid TEXT, epoch INT, n INT, t0 REAL, t1 REAL,
    start INT, delivered INT, pending INT, demoted INT);
"""


def text(cid: str, epoch: int, i: int) -> str:
    """The text of message ``i`` of ``cid``'s history in ``epoch``."""
    return f"{cid} e{epoch} m{i}" if i < OPENING else f"{cid} m{i}"


def role(i: int) -> str:
    """Turns are a user message and one reply."""
    return ("user", "assistant")[i % 2]


def key(cid: str, epoch: int, i: int) -> str:
    """The dedup key the engine gives message ``i`` of that history."""
    return make_key(cid, i, fingerprint(role(i), text(cid, epoch, i), (), None))


class History:
    """The messages of every (conversation, epoch) this worker read, kept by identity.

    A chat history read from the same store returns the same objects in this process, so
    the engine's per-process caches work as in an application.
    """

    def __init__(self) -> None:
        self._made: dict[tuple[str, int], list[tuple[str, str]]] = {}

    def of(self, cid: str, epoch: int, n: int) -> list[tuple[str, str]]:
        made = self._made.setdefault((cid, epoch), [])
        while len(made) < n:
            i = len(made)
            made.append((role(i), text(cid, epoch, i)))
        return made[:n]


class Sink:
    """The shared long tail and bookkeeping: one SQLite file, one connection per thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def db(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def create(self) -> None:
        self.db().executescript(SCHEMA)

    def set_history(self, cid: str, epoch: int, length: int) -> None:
        self.db().execute("INSERT OR REPLACE INTO history VALUES (?, ?, ?)", (cid, epoch, length))

    def history(self, cid: str) -> tuple[int, int]:
        row = self.db().execute("SELECT epoch, length FROM history WHERE cid = ?", (cid,))
        found = row.fetchone()
        return (found[0], found[1]) if found else (0, 0)

    def begin_read(self, cid: str, append: int) -> tuple[int, int]:
        """Take the write lock, append ``append`` messages, return (epoch, length).

        The caller ends the transaction (:meth:`end_read`) once the load read its state.
        """
        db = self.db()
        db.execute("BEGIN IMMEDIATE")
        epoch, length = self.history(cid)
        if append:
            length += append
            db.execute("INSERT OR REPLACE INTO history VALUES (?, ?, ?)", (cid, epoch, length))
        return epoch, length

    def end_read(self) -> None:
        db = self.db()
        if db.in_transaction:
            db.execute("COMMIT")

    def write(self, worker: str, batch: Demotion, *, check_fence: bool) -> bool:
        """Store ``batch`` (a row per message, duplicates kept); refuse a stale fence."""
        fence = batch.fence if batch.fence is not None else -1
        cid, now = batch.conversation_id, time.time()
        db = self.db()
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT highest FROM fences WHERE cid = ?", (cid,)).fetchone()
            highest = row[0] if row else -1
            if check_fence and fence < highest:
                db.execute(
                    "INSERT INTO refused VALUES (?, ?, ?, ?, ?)", (worker, cid, fence, highest, now)
                )
                return False
            db.execute("INSERT OR REPLACE INTO fences VALUES (?, ?)", (cid, max(fence, highest)))
            db.executemany(
                "INSERT INTO delivered VALUES (?, ?, ?, ?, ?, ?)",
                [(worker, cid, m.index, m.key, fence, now) for m in batch.messages],
            )
            return True
        finally:
            db.execute("COMMIT")

    def called(self, worker: str, batch: Demotion, entered: float, ok: bool) -> None:
        idx = [m.index for m in batch.messages]
        self.db().execute(
            "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (worker, batch.conversation_id, batch.fence, min(idx, default=-1),
             max(idx, default=-2) + 1, entered, time.time(), int(ok)),
        )  # fmt: skip

    def loaded(self, worker: str, cid: str, epoch: int, n: int, t0: float, w: Any) -> None:
        self.db().execute(
            "INSERT INTO loads VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (worker, cid, epoch, n, t0, time.time(), w.start, w.delivered, w.pending, w.demoted),
        )

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return self.db().execute(sql, args).fetchall()

    def close(self) -> None:
        """Close every thread's connection (the sink is not used after this)."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
