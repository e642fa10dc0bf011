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

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from os import PathLike
from typing import Any, Literal

from demote._closing import Closing
from demote._validate import count, file_path, seconds
from demote.backends.sqlite_kind import OUTBOX, check_kind, claim_kind, connect
from demote.backends.sqlite_tx import immediate
from demote.capture import _outbox_schema as schema
from demote.capture._checkpoints import CheckpointStats, WalCheckpoints
from demote.capture.codec import decode, dedup_key
from demote.capture.dispatch import RetryPolicy
from demote.erase import conversation_hash
from demote.errors import ArgumentTypeError, ConfigError, FencedOut, StoreError
from demote.records import storable_text
from demote.state.base import validate_conversation_id

__all__ = ["CheckpointStats", "DeadLetter", "OutboxRow", "SQLiteOutbox"]


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
        item: The item, read back (a ``Demotion`` has ``raw=None`` on every message);
            ``None`` for a row whose payload was unreadable (``error`` says why).
        attempts: How many deliveries were tried.
        error: The last error, as ``"Type: message"``.
        failed_at: When it was given up on (Unix time).
    """

    key: str
    item: Any
    attempts: int
    error: str | None
    failed_at: float


#: Seconds ``put`` (on the request path) waits, at most, for a locked outbox.
PUT_WAIT = 0.05


@contextmanager
def _translated(path: str, action: str, timeout: float | None = None) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        waited = ""
        if timeout is not None and "locked" in str(exc):
            waited = f" (another writer held the file's lock for timeout={timeout:g} s)"
        raise StoreError(f"outbox {path!r}: {action} failed: {exc}{waited}") from exc


def _fence(fence: object) -> int | None:
    """A fencing token as SQLite can store it (a 64-bit int), or ``None``."""
    return None if fence is None else count("fence", fence, minimum=0, maximum=2**63 - 1)


def _dead_letter(key: object, payload: object, attempts: object, err: object, at: object) -> Any:
    """A dead letter as read back; an unreadable payload's item is ``None`` (never raises)."""
    try:
        item = decode(payload) if isinstance(payload, str) else None
    except StoreError:
        item = None  # a corrupt row buried by the Recorder: its error says why
    return DeadLetter(
        key=str(key),
        item=item,
        attempts=attempts if type(attempts) is int else 0,
        error=None if err is None else str(err),
        failed_at=float(at) if isinstance(at, int | float) else 0.0,
    )


class SQLiteOutbox(WalCheckpoints, Closing):
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
        timeout: Seconds the worker's writes wait for another process's write lock
            before they fail with :class:`~demote.errors.StoreError`. ``put``, on the
            request path, waits at most :data:`PUT_WAIT` (50 ms) of it, for the file's
            lock and for the worker together: a locked outbox fails the put fast (nothing
            stored; a demotion hook's caller keeps its watermark and retries on a later
            load) instead of holding the request for a lock another writer may keep.
        read_only: Open an existing outbox to read it (``pending``, ``load``,
            ``dead_letters``: ``demote inspect``) without ever writing to the file: it
            must exist and be an outbox of this version, and every write raises
            :class:`~demote.errors.StoreError`.

    Raises:
        ConfigError: ``path``, ``retry``, ``synchronous``, ``checkpoint_every``,
            ``wal_limit`` or ``timeout`` is invalid.
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
        timeout: float = 2.0,
        read_only: bool = False,
    ) -> None:
        if not isinstance(read_only, bool):
            raise ArgumentTypeError(f"read_only: must be a bool, got {read_only!r:.40}")
        if synchronous not in ("NORMAL", "FULL"):
            raise ConfigError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r:.40}")
        count("checkpoint_every", checkpoint_every)
        count("wal_limit", wal_limit)
        if checkpoint_every > wal_limit:
            raise ConfigError(
                f"need checkpoint_every <= wal_limit, got {checkpoint_every}, {wal_limit}"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ArgumentTypeError(f"retry: must be a RetryPolicy or None, got {retry!r:.40}")
        self.timeout = seconds("timeout", timeout, zero=True)
        self.path = file_path("outbox path", path)
        self.retry = retry if retry is not None else RetryPolicy()
        self.checkpoint_every = checkpoint_every
        self.wal_limit = wal_limit
        self._lock = threading.Lock()
        self._init_checkpoints()
        self.read_only = read_only
        with _translated(self.path, "open"):
            self._db = connect(self.path, self.timeout, read_only=read_only, kind=OUTBOX)
        try:
            with _translated(self.path, "open", self.timeout):
                # Whose file it is comes first: switching a foreign file to WAL writes to it.
                claimed = check_kind(self._db, self.path, OUTBOX, schema.OWN_TABLES)
                if read_only:
                    schema.check_current(self._db, self.path, claimed)
                    return
                (mode,) = self._db.execute("PRAGMA journal_mode=WAL").fetchone()
                self._db.execute(f"PRAGMA synchronous={synchronous}")
                self._db.execute("PRAGMA secure_delete=ON")  # deleted rows leave no bytes
                schema.create(self._db)
                if not claimed:
                    claim_kind(self._db, OUTBOX)
                if str(mode).lower() == "wal":  # not for ":memory:": nothing to checkpoint
                    self._start_checkpoints(synchronous)
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        """Stop the checkpoint thread and close the connections (rows stay in the file).

        Idempotent. Closing the last connection checkpoints what is left in the WAL.
        """
        self._stop_checkpoints()
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
            payload: The item, encoded (``demote.capture.codec.encode``).
            conversation: The conversation it belongs to, if any (what erase finds it by).
            fence: The fencing token it was delivered under, if any.

        Raises:
            FencedOut: ``fence`` is older than the conversation's last erase; nothing was
                stored.
            StoreError: The write failed.
        """
        fence = _fence(fence)
        if not isinstance(payload, str):
            raise ArgumentTypeError(f"payload: must be a str, got {type(payload).__name__}")
        if not isinstance(key, str):
            raise ArgumentTypeError(f"key: must be a str, got {type(key).__name__}")
        key, payload = dedup_key(None, key), storable_text(payload)
        if conversation is not None:
            validate_conversation_id(conversation, "conversation")
        h = None if conversation is None else conversation_hash(conversation)
        began = time.monotonic()
        wait = min(self.timeout, PUT_WAIT)
        if not self._lock.acquire(timeout=wait):  # the worker is inside a write that waits
            raise StoreError(
                f"outbox {self.path!r}: put failed: busy for {wait:g} s (another writer holds "
                "the file's lock); nothing was stored"
            )
        try:
            left = max(0.001, wait - (time.monotonic() - began))
            with _translated(self.path, "put", wait), self._busy(left):
                return self._put(key, payload, h, fence, conversation)
        finally:
            self._lock.release()

    @contextmanager
    def _busy(self, seconds: float) -> Iterator[None]:
        """Wait at most ``seconds`` for the file's lock (instead of ``timeout``), then restore."""
        self._db.execute(f"PRAGMA busy_timeout = {max(1, int(seconds * 1000))}")
        try:
            yield
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")

    def _put(
        self, key: str, payload: str, h: str | None, fence: int | None, conversation: str | None
    ) -> int:
        """The insert of :meth:`put`, under the lock."""
        # One statement, so the fence check and the write are atomic across processes
        # (no fence, no conversation: the NULL compares as false and the row goes in).
        cursor = self._db.execute(
            "INSERT INTO outbox (key, payload, created_at, conversation)"
            " SELECT ?, ?, ?, ? WHERE NOT EXISTS"
            " (SELECT 1 FROM erased WHERE conversation = ? AND fence > ?)",
            (key, payload, time.time(), h, h, fence),
        )
        if cursor.rowcount == 0:
            (erased,) = self._db.execute(
                "SELECT fence FROM erased WHERE conversation = ?", (h,)
            ).fetchone()
            raise FencedOut(
                f"outbox {self.path!r}: a batch of conversation {conversation!r} carries "
                f"fencing token {fence}, older than its erase (token {erased}); refused"
            )
        row = cursor.lastrowid
        self._committed()
        assert row is not None
        return row

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
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
        h = conversation_hash(validate_conversation_id(conversation_id))
        fence = _fence(fence)
        with self._lock, _translated(self.path, "erase", self.timeout):
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
        with self._lock, _translated(self.path, "ack", self.timeout):
            self._db.execute("DELETE FROM outbox WHERE id = ?", (row,))
            self._committed()

    def fail(self, row: int, attempts: int, error: str | None) -> None:
        """Record a failed attempt of an item that will be retried."""
        with self._lock, _translated(self.path, "fail", self.timeout):
            self._db.execute(
                "UPDATE outbox SET attempts = ?, last_error = ? WHERE id = ?",
                (attempts, error, row),
            )
            self._committed()

    def bury(self, row: int, attempts: int, error: str | None) -> None:
        """Move an item that failed its last attempt to the dead letters."""
        with self._lock, _translated(self.path, "bury", self.timeout):
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
        return [_dead_letter(*row) for row in rows]

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
        with self._lock, _translated(self.path, "replay_dead_letters", self.timeout):
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

    def _transaction(self) -> AbstractContextManager[None]:
        return immediate(self._db)
