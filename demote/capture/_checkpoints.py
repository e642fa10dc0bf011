"""The outbox's WAL checkpoints, kept off the enqueue path.

See the module docstring of :mod:`demote.capture.outbox` for the theory of operation: a
background thread with its own connection runs PASSIVE checkpoints every
``checkpoint_every`` commits, makes the WAL start over once it holds ``wal_limit`` pages,
and a commit runs one inline (the safety valve) if the thread falls behind. An erase ends
with a TRUNCATE checkpoint, so erased bytes do not survive in the WAL.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import weakref
from dataclasses import dataclass

from demote.backends.wal import truncate_wal

logger = logging.getLogger("demote.capture")


@dataclass(frozen=True, slots=True)
class CheckpointStats:
    """How the outbox's WAL has been checkpointed (see :mod:`demote.capture.outbox`).

    Attributes:
        background: PASSIVE checkpoints the checkpoint thread ran without the lock.
        restarts: Those it then ran holding the lock, the WAL having reached ``wal_limit``.
        valve: Checkpoints the safety valve ran inline, in a caller's commit.
        wal_pages: Pages in the WAL at the last checkpoint (0 before the first).
    """

    background: int = 0
    restarts: int = 0
    valve: int = 0
    wal_pages: int = 0


class WalCheckpoints:
    """The checkpoint half of :class:`~demote.capture.SQLiteOutbox` (a mixin).

    The outbox sets ``path``, ``checkpoint_every``, ``wal_limit``, ``_lock`` and ``_db``,
    calls :meth:`_init_checkpoints` first, :meth:`_start_checkpoints` once its file is in
    WAL mode, :meth:`_committed` after each write commit (locked) and
    :meth:`_stop_checkpoints` on close.
    """

    path: str
    checkpoint_every: int
    wal_limit: int
    _lock: threading.Lock
    _db: sqlite3.Connection

    def _init_checkpoints(self) -> None:
        # Bookkeeping, under _lock: commits so far, and the WAL's size in pages as of the
        # commit count a checkpoint last reported it at.
        self._commits = 0
        self._reported_at = 0
        self._wal_pages = 0
        self._signalled_at = 0
        self._valve_after = 0
        self._stats = CheckpointStats()
        self._wake = threading.Event()
        self._stopping = False
        self._checkpointer: threading.Thread | None = None
        self._ckpt_db: sqlite3.Connection | None = None

    def _start_checkpoints(self, synchronous: str) -> None:
        """Take checkpoints over from SQLite: a second connection, in its own thread."""
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._ckpt_db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._ckpt_db.execute(f"PRAGMA synchronous={synchronous}")
        self._checkpointer = threading.Thread(
            target=_checkpoint_loop,
            args=(weakref.ref(self), self._wake, self._ckpt_db),
            name="demote-outbox-checkpoint",
            daemon=True,
        )
        weakref.finalize(self, self._wake.set)  # dropped unclosed: the thread ends
        self._checkpointer.start()

    def _stop_checkpoints(self) -> None:
        """End the thread (idempotent); the caller closes the connections."""
        self._stopping = True
        self._wake.set()
        thread = self._checkpointer
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def checkpoints(self) -> CheckpointStats:
        """A snapshot of the checkpoint counters (see :class:`CheckpointStats`)."""
        with self._lock:
            return self._stats

    def _committed(self) -> None:
        """After each write commit (locked): wake the checkpoint thread, or open the valve."""
        if self._checkpointer is None:
            return
        self._commits += 1
        if self._commits - self._signalled_at >= self.checkpoint_every:
            self._signalled_at = self._commits
            self._wake.set()
        pages = self._wal_pages + self._commits - self._reported_at  # >= 1 page per commit
        if pages >= 2 * self.wal_limit and self._commits >= self._valve_after:
            # The checkpoint thread is not keeping up (failing, or starved of the disk).
            self._valve_after = self._commits + self.checkpoint_every  # should this fail
            try:
                self._checkpoint(self._db, "valve")
            except sqlite3.Error as exc:  # the write itself is committed: do not fail it
                logger.warning("outbox %r: checkpoint failed: %s", self.path, exc)

    def _truncate_wal(self) -> None:
        """Copy the WAL back and truncate it to zero bytes (locked; after an erase).

        A checkpoint the background thread is running at that moment makes it busy:
        retried for up to a second, then a :class:`StoreError` (the erased rows are
        deleted, but their bytes may remain in the WAL until the next checkpoint).
        """
        if self._checkpointer is None:
            return  # not in WAL mode (":memory:"): no WAL to truncate
        truncate_wal(self._db)
        self._report(self._commits, 0, "truncate", whole=True)

    def _checkpoint(self, db: sqlite3.Connection, kind: str) -> None:
        """One PASSIVE checkpoint with nothing of ours committing meanwhile (locked).

        Copied whole, the WAL starts over from its first page at the next commit.
        """
        busy, wal, done = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self._report(self._commits, wal, kind, whole=not busy and done == wal)

    def _report(self, commits: int, wal: int, kind: str, *, whole: bool = False) -> None:
        """Record a checkpoint that saw ``wal`` pages after ``commits`` commits (locked)."""
        if commits >= self._reported_at:
            self._reported_at, self._wal_pages = commits, 0 if whole else max(0, wal)
        s = self._stats
        self._stats = CheckpointStats(
            background=s.background + (kind == "background"),
            restarts=s.restarts + (kind == "restart"),
            valve=s.valve + (kind == "valve"),
            wal_pages=max(0, wal),
        )

    def _background_checkpoint(self, db: sqlite3.Connection) -> None:
        """One round of the checkpoint thread."""
        with self._lock:
            commits = self._commits  # the checkpoint below sees at least these
        (_, wal, _) = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        with self._lock:
            self._report(commits, wal, "background")
            if wal >= self.wal_limit:
                # Commits kept landing during our checkpoints, so the WAL never started
                # over. The pass above copied the bulk; copy the rest holding the lock (a
                # commit arriving now waits for it), and the next commit starts it over.
                self._checkpoint(db, "restart")


def _checkpoint_loop(
    ref: weakref.ref[WalCheckpoints], wake: threading.Event, db: sqlite3.Connection
) -> None:
    """The checkpoint thread. It holds its outbox weakly: an outbox dropped unclosed ends it."""
    while True:
        wake.wait()
        wake.clear()
        outbox = ref()
        if outbox is None or outbox._stopping:
            return
        try:
            outbox._background_checkpoint(db)
        except sqlite3.Error as exc:  # the valve bounds the WAL if this keeps failing
            logger.warning("outbox %r: background checkpoint failed: %s", outbox.path, exc)
        del outbox
