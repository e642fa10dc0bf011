"""What an outbox file holds: its tables, the upgrade of older files, conversation hashes.

Tables:

* ``outbox``: the items waiting for delivery (dedup key, payload, attempts, last error),
  and ``conversation``, a hash of the item's conversation id (``NULL`` for a plain JSON
  value, which belongs to none), indexed, so an erase finds a conversation's rows without
  reading anyone's payload.
* ``dead_letters``: the items that failed every attempt, with the same ``conversation``.
* ``erased``: per conversation hash, the fencing token of its last erase (the *fence
  table*): a batch delivered under an older token is refused (see
  :class:`~demote.errors.FencedOut`).

The conversation is named by a hash (blake2b, 16 bytes, of its UTF-8 id), not by its id,
so the fence table keeps no conversation id once the conversation is erased: reading the
file does not list who asked to be forgotten. It is not a secret: whoever can guess an id
can hash it and confirm it was erased.

A file written before the ``conversation`` column existed is upgraded when opened: the
column is added and filled in from each row's payload (decoded, never pattern-matched),
in one transaction.
"""

from __future__ import annotations

import logging
import sqlite3

from demote.backends.sqlite_kind import OUTBOX, Columns, declare, schema_columns
from demote.capture.codec import conversation_of, decode
from demote.erase import conversation_hash
from demote.errors import StoreError

logger = logging.getLogger("demote.capture")

#: The tables an outbox file may hold (another table means another program's file).
OWN_TABLES = ("outbox", "dead_letters", "erased")

TABLES = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at REAL NOT NULL,
    conversation TEXT
);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    error TEXT,
    created_at REAL NOT NULL,
    failed_at REAL NOT NULL,
    conversation TEXT
);
CREATE TABLE IF NOT EXISTS erased (
    conversation TEXT PRIMARY KEY,
    fence INTEGER NOT NULL
) WITHOUT ROWID;
"""

INDEXES = """
CREATE INDEX IF NOT EXISTS outbox_conversation ON outbox (conversation);
CREATE INDEX IF NOT EXISTS dead_letters_conversation ON dead_letters (conversation);
"""


def _declared() -> Columns:
    """Each table's columns; a file from before ``conversation`` lacks that one."""
    newest = schema_columns([TABLES])
    old = ("outbox", "dead_letters")
    return {t: (cols - {"conversation"} if t in old else cols, cols) for t, cols in newest.items()}


declare(OUTBOX, _declared)


def item_conversation(payload: str) -> str | None:
    """The conversation hash of a stored payload (``None``: a plain value, or unreadable)."""
    try:
        cid = conversation_of(decode(payload))
    except StoreError:
        return None
    return None if cid is None else conversation_hash(cid)


def create(db: sqlite3.Connection) -> None:
    """Create the tables, upgrade an older file, then index (autocommit connection)."""
    db.executescript(TABLES)
    for table in ("outbox", "dead_letters"):
        if not _has_conversation(db, table):
            _upgrade(db)
            break
    db.executescript(INDEXES)


def check_current(db: sqlite3.Connection, path: str, claimed: bool) -> None:
    """Refuse, for a read-only open, a file that is not an outbox of this version."""
    if not claimed or not all(_has_conversation(db, t) for t in ("outbox", "dead_letters")):
        raise StoreError(
            f"{path!r} is not an outbox of this demote's version: open it read-write once "
            "(a Recorder with this outbox) to create or upgrade it"
        )


def _has_conversation(db: sqlite3.Connection, table: str) -> bool:
    return any(row[1] == "conversation" for row in db.execute(f"PRAGMA table_info({table})"))


def _upgrade(db: sqlite3.Connection) -> None:
    """Add ``conversation`` to a file written before it, filled in from the payloads."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for table in ("outbox", "dead_letters"):
            if _has_conversation(db, table):  # another process upgraded it meanwhile
                continue
            db.execute(f"ALTER TABLE {table} ADD COLUMN conversation TEXT")
            rows = db.execute(f"SELECT id, payload FROM {table}").fetchall()
            db.executemany(
                f"UPDATE {table} SET conversation = ? WHERE id = ?",
                [(item_conversation(payload), row) for row, payload in rows],
            )
            logger.info("outbox: added the conversation column to %d %s row(s)", len(rows), table)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
