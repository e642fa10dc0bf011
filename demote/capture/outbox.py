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

Checkpoints stay off the enqueue path. SQLite's automatic checkpoint (copying the WAL back
into the database file, with its fsyncs: a few milliseconds) would run inside whichever
commit crosses its threshold, i.e. in the caller's ``enqueue`` every few hundred items. The
outbox turns it off (``wal_autocheckpoint=0``) and runs PASSIVE checkpoints on a second
connection in its own daemon thread instead, woken every ``checkpoint_every`` commits
(enqueues and the worker's acks alike), so they keep up even while the sink is stalled, and
without the lock ``enqueue`` takes. A checkpoint changes where committed rows live, never
whether they are committed: durability is as above, and ``close`` (the last connection)
still checkpoints what is left and removes the WAL.

The WAL is bounded by ``wal_limit`` pages. It starts over from its first page only at a
commit that finds it copied back whole, which a stream of enqueues arriving faster than a
checkpoint completes never does. So once the WAL holds ``wal_limit`` pages, the checkpoint
thread copies the remainder (the pages written since its last pass) holding the lock, and
an ``enqueue`` that arrives during that pass waits for it (a few pages and the two fsyncs),
once per ``wal_limit`` pages of a sustained stream (each enqueue writes two or three). An
idle moment longer than one checkpoint lets the WAL start over on its own. Safety valve:
if the thread falls behind anyway (checkpoints failing, or starved of the disk) and the WAL
reaches about twice ``wal_limit`` (estimated from the last checkpoint's report plus one
page per commit since), the committing call runs the checkpoint itself, inline.

Erase: :meth:`SQLiteOutbox.erase` deletes a conversation's queued items and dead letters
(found by a hash of the conversation id stored with each row, see
:mod:`demote.capture._outbox_schema`; a plain JSON value belongs to no conversation). The
connection runs with ``secure_delete`` on, so a deleted row's bytes are overwritten in the
file rather than left in free space (delivered items too: their rows are deleted the same
way), and an erase ends with a TRUNCATE checkpoint, so they do not survive in the WAL
either. An erase made under a fencing token is remembered per conversation: a batch that
arrives later with an older token (from a worker whose lease the erase revoked) is refused
with :class:`~demote.errors.FencedOut` instead of being queued.

Use one Recorder per outbox file at a time: a second Recorder started on the same file
would take the first one's queued rows for leftovers and deliver them too (harmless for
idempotent sinks, but wasted work). ``sqlite3`` errors surface as
:class:`~demote.errors.StoreError`.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from os import PathLike
from typing import Any, Literal

from demote._closing import Closing
from demote.capture import _outbox_schema as schema
from demote.capture.codec import decode
from demote.capture.dispatch import RetryPolicy
from demote.errors import ConfigError, FencedOut, StoreError

__all__ = ["CheckpointStats", "DeadLetter", "OutboxRow", "SQLiteOutbox"]

logger = logging.getLogger("demote.capture")

_TRUNCATE_PATIENCE = 1.0  # seconds an erase retries a TRUNCATE checkpoint that is busy


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


@dataclass(frozen=True, slots=True)
class CheckpointStats:
    """How the outbox's WAL has been checkpointed (see the module docstring).

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


class SQLiteOutbox(Closing):
    """A durable outbox in a SQLite file (created if missing).

    Safe to share between the threads of one process (one connection behind a lock, plus
    a checkpoint thread with its own connection).

    Args:
        path: The database file (``":memory:"`` works but survives nothing).
        retry: Attempts and backoff for failed items; defaults to 5 attempts, 0.5 s base.
        synchronous: ``"NORMAL"`` (survives process crashes) or ``"FULL"`` (also power
            loss); see the module docstring.
        checkpoint_every: Commits between background checkpoints (>= 1).
        wal_limit: The WAL's size bound, in pages (>= ``checkpoint_every``; 4,096 pages is
            16 MiB at SQLite's default page size). Past it the checkpoint thread makes the
            WAL start over; at twice it a commit checkpoints inline (see the module
            docstring).

    Raises:
        ConfigError: ``synchronous``, ``checkpoint_every`` or ``wal_limit`` is invalid.
        StoreError: The file cannot be opened or is not an outbox.
    """

    def __init__(
        self,
        path: str | PathLike[str],
        *,
        retry: RetryPolicy | None = None,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        checkpoint_every: int = 256,
        wal_limit: int = 4096,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ConfigError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int):
            raise ConfigError(f"checkpoint_every must be an int, got {checkpoint_every!r}")
        if isinstance(wal_limit, bool) or not isinstance(wal_limit, int):
            raise ConfigError(f"wal_limit must be an int, got {wal_limit!r}")
        if not 1 <= checkpoint_every <= wal_limit:
            raise ConfigError(
                f"need 1 <= checkpoint_every <= wal_limit, got {checkpoint_every}, {wal_limit}"
            )
        self.path = str(path)
        self.retry = retry if retry is not None else RetryPolicy()
        self.checkpoint_every = checkpoint_every
        self.wal_limit = wal_limit
        self._lock = threading.Lock()
        # Checkpoint bookkeeping, under _lock: commits so far, and the WAL's size in pages
        # as of the commit count a checkpoint last reported it at.
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
        with _translated(self.path, "open"):
            self._db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=30
            )
            (mode,) = self._db.execute("PRAGMA journal_mode=WAL").fetchone()
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA secure_delete=ON")  # deleted rows leave no bytes
            schema.create(self._db)
            if str(mode).lower() == "wal":  # not for ":memory:": nothing to checkpoint
                self._db.execute("PRAGMA wal_autocheckpoint=0")
                self._ckpt_db = sqlite3.connect(
                    self.path, check_same_thread=False, isolation_level=None
                )
                self._ckpt_db.execute(f"PRAGMA synchronous={synchronous}")
                self._checkpointer = threading.Thread(
                    target=_checkpoint_loop,
                    args=(weakref.ref(self), self._wake, self._ckpt_db),
                    name="demote-outbox-checkpoint",
                    daemon=True,
                )
                weakref.finalize(self, self._wake.set)  # dropped unclosed: the thread ends
                self._checkpointer.start()

    @property
    def checkpoints(self) -> CheckpointStats:
        """A snapshot of the checkpoint counters (see :class:`CheckpointStats`)."""
        with self._lock:
            return self._stats

    def close(self) -> None:
        """Stop the checkpoint thread and close the connections (rows stay in the file).

        Idempotent. Closing the last connection checkpoints what is left in the WAL.
        """
        self._stopping = True
        self._wake.set()
        thread = self._checkpointer
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock, _translated(self.path, "close"):
            if self._ckpt_db is not None:
                self._ckpt_db.close()
            self._db.close()

    def put(
        self, key: str, payload: str, *, conversation: str | None = None, fence: int | None = None
    ) -> int:
        """Store one item durably; returns its row id.

        Args:
            key: The item's dedup key.
            payload: The item, encoded (:func:`~demote.capture.codec.encode`).
            conversation: The conversation it belongs to, if any (what erase finds it by).
            fence: The fencing token it was delivered under, if any.

        Raises:
            FencedOut: ``fence`` is older than the conversation's last erase; nothing was
                stored.
            StoreError: The write failed.
        """
        h = None if conversation is None else schema.conversation_hash(conversation)
        with self._lock, _translated(self.path, "put"):
            insert = (
                "INSERT INTO outbox (key, payload, created_at, conversation) VALUES (?, ?, ?, ?)"
            )
            args = (key, payload, time.time(), h)
            if fence is None or h is None:
                row = self._db.execute(insert, args).lastrowid
            else:
                with self._transaction():  # the check and the write, atomic across processes
                    erased = self._db.execute(
                        "SELECT fence FROM erased WHERE conversation = ?", (h,)
                    ).fetchone()
                    if erased is not None and fence < erased[0]:
                        raise FencedOut(
                            f"outbox {self.path!r}: a batch of conversation {conversation!r} "
                            f"carries fencing token {fence}, older than its erase (token "
                            f"{erased[0]}); refused"
                        )
                    row = self._db.execute(insert, args).lastrowid
            self._committed()
            assert row is not None
            return row

    def erase(
        self,
        conversation_id: str,
        *,
        fence: int | None = None,
        keys: Sequence[str] | None = None,
    ) -> int:
        """Delete the conversation's queued items and dead letters, bytes included.

        A running Recorder must not deliver them afterwards: erase through
        :meth:`Recorder.erase <demote.capture.Recorder.erase>`, which also drops them from
        its memory. Rows are deleted with ``secure_delete`` on, then the WAL is
        checkpointed and truncated, so the text survives neither in the file's free space
        nor in the WAL.

        Args:
            conversation_id: The conversation.
            fence: The erase's fencing token: later batches of the conversation carrying
                an older one are refused (:class:`~demote.errors.FencedOut`).
            keys: Unused (rows are found by conversation); part of the tier protocol.

        Returns:
            How many rows were deleted (queued and dead letters).

        Raises:
            StoreError: The delete or the checkpoint failed.
        """
        h = schema.conversation_hash(conversation_id)
        with self._lock, _translated(self.path, "erase"):
            with self._transaction():
                removed = sum(
                    self._db.execute(f"DELETE FROM {table} WHERE conversation = ?", (h,)).rowcount
                    for table in ("outbox", "dead_letters")
                )
                if fence is not None:
                    self._db.execute(
                        "INSERT INTO erased (conversation, fence) VALUES (?, ?) ON CONFLICT "
                        "(conversation) DO UPDATE SET fence = max(fence, excluded.fence)",
                        (h, fence),
                    )
            self._committed()
            self._truncate_wal()
        return removed

    def ack(self, row: int) -> None:
        """Forget a delivered item."""
        with self._lock, _translated(self.path, "ack"):
            self._db.execute("DELETE FROM outbox WHERE id = ?", (row,))
            self._committed()

    def fail(self, row: int, attempts: int, error: str | None) -> None:
        """Record a failed attempt of an item that will be retried."""
        with self._lock, _translated(self.path, "fail"):
            self._db.execute(
                "UPDATE outbox SET attempts = ?, last_error = ? WHERE id = ?",
                (attempts, error, row),
            )
            self._committed()

    def bury(self, row: int, attempts: int, error: str | None) -> None:
        """Move an item that failed its last attempt to the dead letters."""
        with self._lock, _translated(self.path, "bury"):
            with self._transaction():
                self._db.execute(
                    "INSERT INTO dead_letters"
                    " (key, payload, attempts, error, created_at, failed_at, conversation)"
                    " SELECT key, payload, ?, ?, created_at, ?, conversation"
                    " FROM outbox WHERE id = ?",
                    (attempts, error, time.time(), row),
                )
                self._db.execute("DELETE FROM outbox WHERE id = ?", (row,))
            self._committed()

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
        with self._lock, _translated(self.path, "replay_dead_letters"):
            with self._transaction():
                first = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM outbox").fetchone()
                self._db.execute(
                    "INSERT INTO outbox (key, payload, attempts, created_at, conversation)"
                    " SELECT key, payload, 0, created_at, conversation FROM dead_letters"
                    " ORDER BY id"
                )
                self._db.execute("DELETE FROM dead_letters")
                rows = self._db.execute(
                    "SELECT id, key, payload, attempts FROM outbox WHERE id > ? ORDER BY id",
                    first,
                ).fetchall()
            self._committed()
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

    # -- checkpoints -------------------------------------------------------------------

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
        deadline = time.monotonic() + _TRUNCATE_PATIENCE
        while True:
            busy, wal, done = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                self._report(self._commits, 0, "truncate", whole=True)
                return
            if time.monotonic() >= deadline:
                raise sqlite3.OperationalError(
                    f"the WAL could not be truncated (busy; {done} of {wal} pages copied): "
                    "erased bytes may remain in it until the next checkpoint"
                )
            time.sleep(0.01)

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
    ref: weakref.ref[SQLiteOutbox], wake: threading.Event, db: sqlite3.Connection
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
