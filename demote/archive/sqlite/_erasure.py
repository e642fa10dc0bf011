"""Erasing one conversation from the SQLite archive, bytes included.

What holds a conversation in an archive file, and how each is removed:

* ``messages`` (text, context, neighbours' text, key): deleted; the ``AFTER DELETE``
  triggers take its full-text entries and its vectors along.
* ``conversations``, ``terms`` (the index tokens it contains) and ``speakers``:
  deleted (:func:`demote.archive._lexical.drop_terms`).
* The full-text index. An external-content FTS5 table does not remove a deleted row's
  tokens: it appends a *delete marker* to a new segment, and the old segment keeps the
  tokens (the text's words, lowercased and stemmed) until a merge rewrites it. So an
  erase ends with FTS5's ``optimize``, which merges every segment into one and drops
  what the markers cancel. Its cost grows with the whole index (about 0.3 s at 20,000
  messages of ~50 words, 1.5 s at 100,000: ``python -m bench.erase_cost``), also right
  after another erase, whose markers make a new segment. ``VACUUM`` would not do: it
  copies the segments as they are. (SQLite 3.42 added FTS5's ``secure-delete`` option,
  which removes the tokens at the delete; many Pythons ship an older SQLite: 3.40 here.)
* Free space. The connection runs with ``PRAGMA secure_delete = ON``, so every deleted
  cell and freed page is overwritten with zeros, in the file and the WAL frames written
  from then on, instead of being left in free space.
* The WAL. The old frames still hold the pages as they were before the erase; the archive
  runs a ``TRUNCATE`` checkpoint after it (:func:`demote.backends.wal.truncate_wal`), so the WAL
  file is empty when ``erase`` returns.

Fencing: an erase made under a fencing token is remembered in ``erased``, keyed by
:func:`demote.erase.conversation_hash` (never the id): :func:`check_fence` then refuses a
later batch of that conversation carrying an older token (a worker whose lease the erase
revoked), with :class:`~demote.errors.FencedOut`, inside the delivery's transaction.

A file written by an older version on an SQLite built without ``secure_delete`` (it is
on by default in some builds, Debian's among them, off in others) may still hold bytes
of rows deleted back then in its free pages: ``VACUUM`` it once.
"""

from __future__ import annotations

import sqlite3

from demote.archive import _lexical
from demote.erase import conversation_hash
from demote.errors import FencedOut

__all__ = ["SCHEMA", "check_fence", "erase_rows"]

#: The fence table (created with the archive's schema, version 4).
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS erased (
        conversation TEXT PRIMARY KEY, fence INTEGER NOT NULL
    ) WITHOUT ROWID""",
)


def check_fence(db: sqlite3.Connection, conversation_id: str, fence: int | None) -> None:
    """Refuse a batch whose fencing token predates its conversation's last erase.

    Raises:
        FencedOut: ``fence`` is older than the erase's; the caller rolls back.
    """
    if fence is None:
        return
    row = db.execute(
        "SELECT fence FROM erased WHERE conversation = ? AND fence > ?",
        (conversation_hash(conversation_id), fence),
    ).fetchone()
    if row is not None:
        raise FencedOut(
            f"archive: a batch of conversation {conversation_id!r} carries fencing token "
            f"{fence}, older than its erase (token {row[0]}); refused"
        )


def erase_rows(db: sqlite3.Connection, conversation_id: str, fence: int | None) -> int:
    """Delete the conversation everywhere in the file; returns how many messages.

    Runs in the caller's write transaction; the caller truncates the WAL afterwards.
    """
    _lexical.drop_terms(db, conversation_id)
    removed = db.execute(
        "DELETE FROM messages WHERE conversation_id = ?", (conversation_id,)
    ).rowcount
    if fence is not None:
        db.execute(
            "INSERT INTO erased (conversation, fence) VALUES (?, ?) ON CONFLICT "
            "(conversation) DO UPDATE SET fence = max(fence, excluded.fence)",
            (conversation_hash(conversation_id), fence),
        )
    # Also when nothing was deleted now: a delete of an older version left tokens behind
    # (on an index already merged, with nothing deleted since, it is a no-op).
    db.execute("INSERT INTO messages_fts (messages_fts) VALUES ('optimize')")
    return int(removed)
