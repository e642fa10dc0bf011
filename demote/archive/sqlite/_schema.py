"""The SQLite archive's schema (``PRAGMA user_version = 5``) and its migrations.

::

    messages(id INTEGER PRIMARY KEY, conversation_id, idx, role, text, context, speaker,
             adjacent, key, scope, data, archived_at)
        UNIQUE (conversation_id, key)      -- re-delivery stores nothing twice
        INDEX  (conversation_id, idx)      -- messages() in order, neighbours
    messages_fts USING fts5(scope, text, context, adjacent,
                            content='messages', content_rowid='id',
                            tokenize='porter unicode61')
    conversations(id, conversation_id UNIQUE, messages)      -- messages stored
    terms(conversation, term, in_text, in_any)               -- document frequencies
    speakers(conversation_id, speaker)                       -- who speaks in each
    vectors(seq AUTOINCREMENT, message UNIQUE, conversation_id, idx, vector BLOB)
    settings(name PRIMARY KEY, value)                        -- which model made the vectors
    erased(conversation PRIMARY KEY, fence)                  -- the last erase's fencing token

``adjacent`` holds the text of the messages just before and just after (kept in step as
neighbours arrive, by :func:`refresh_adjacent`), so a reply is found by the words of the
question it answers. ``speaker`` (and the ``speakers`` table) come from a context mapping's
``"speaker"``. Version 2 files gain ``speaker``, ``adjacent``, the speakers and vector
tables and a rebuilt full-text index when opened; version 1 files also gain the term
statistics; files of versions 1 to 3 gain the ``erased`` table (keyed by a hash of the
conversation id; see :mod:`demote.archive.sqlite._erasure`); files of versions 1 to 4 gain
``data`` and ``archived_at``, ``NULL`` in the rows they hold, which therefore come back
text-only (``Recalled.data`` and ``Recalled.at`` are ``None``).

``text`` is what is indexed and returned: the message text, then one line per tool call
(:func:`demote.records.searchable_text`), so a search for a tool's name or an argument
value finds the call. ``data`` is the whole message (:data:`demote.records.MESSAGE_DATA_KEYS`) as
JSON, without ``role`` and, when it equals the ``text`` column, ``text``:
:func:`demote.archive._data.stored_data` writes it, :func:`~demote.archive._data.row_data`
reads it back. ``archived_at`` is when the row was stored (seconds since the epoch).
Each migration runs in the opening transaction: it completes or leaves the file as it was.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from demote.archive import _lexical, _vectors
from demote.archive.sqlite import _erasure
from demote.backends.sqlite_kind import ARCHIVE, Columns, declare, schema_columns
from demote.errors import StoreError

__all__ = ["VERSION", "check_current", "create_or_migrate", "refresh_adjacent"]

VERSION = 5

_MESSAGES = """CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL, idx INTEGER NOT NULL,
    role TEXT NOT NULL, text TEXT NOT NULL, context TEXT NOT NULL DEFAULT '',
    key TEXT NOT NULL, scope TEXT NOT NULL, speaker TEXT NOT NULL DEFAULT '',
    adjacent TEXT NOT NULL DEFAULT '', data TEXT, archived_at REAL,
    UNIQUE (conversation_id, key)
)"""

_FTS = (
    """CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
        scope, text, context, adjacent,
        content='messages', content_rowid='id', tokenize='porter unicode61'
    )""",
    """CREATE TRIGGER IF NOT EXISTS messages_ai AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts (rowid, scope, text, context, adjacent)
        VALUES (new.id, new.scope, new.text, new.context, new.adjacent);
    END""",
    """CREATE TRIGGER IF NOT EXISTS messages_ad AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, scope, text, context, adjacent)
        VALUES ('delete', old.id, old.scope, old.text, old.context, old.adjacent);
    END""",
    """CREATE TRIGGER IF NOT EXISTS messages_au AFTER UPDATE OF adjacent ON messages BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, scope, text, context, adjacent)
        VALUES ('delete', old.id, old.scope, old.text, old.context, old.adjacent);
        INSERT INTO messages_fts (rowid, scope, text, context, adjacent)
        VALUES (new.id, new.scope, new.text, new.context, new.adjacent);
    END""",
)

_SCHEMA = (
    _MESSAGES,
    "CREATE INDEX IF NOT EXISTS messages_conversation_idx ON messages (conversation_id, idx)",
    *_FTS,
    *_lexical.STATS_SCHEMA,
    *_vectors.SCHEMA,
    *_erasure.SCHEMA,
)

# Whose file it is (demote.backends.sqlite_kind): the columns every archive's messages table has
# (older versions lack some of the newest); a table named like one of these with other
# columns is another program's, and the file is refused before anything is written.
_REQUIRED = {"messages": frozenset({"id", "conversation_id", "idx", "role", "text", "key"})}


def _declared() -> Columns:
    newest = schema_columns(_SCHEMA)
    return {t: (_REQUIRED.get(t, frozenset()), cols) for t, cols in newest.items()}


declare(ARCHIVE, _declared)

# The text of the messages at idx - 1 and idx + 1 (a rewrite may leave two at one index:
# the newest counts).
_ADJACENT = """coalesce((SELECT p.text FROM messages AS p WHERE p.conversation_id =
    m.conversation_id AND p.idx = m.idx - 1 ORDER BY p.id DESC LIMIT 1), '') || char(10) ||
    coalesce((SELECT n.text FROM messages AS n WHERE n.conversation_id = m.conversation_id
    AND n.idx = m.idx + 1 ORDER BY n.id DESC LIMIT 1), '')"""


def refresh_adjacent(db: sqlite3.Connection, conversation_id: str, indexes: Iterable[int]) -> None:
    """Recompute ``adjacent`` for the messages at ``indexes`` (and reindex those changed)."""
    wanted = sorted(set(indexes))
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ",".join("?" * len(chunk))
        db.execute(
            f"UPDATE messages AS m SET adjacent = {_ADJACENT} "
            f"WHERE m.conversation_id = ? AND m.idx IN ({marks}) AND m.adjacent != {_ADJACENT}",
            (conversation_id, *chunk),
        )


def create_or_migrate(db: sqlite3.Connection) -> None:
    """Create the schema in a new file or bring an older one to :data:`VERSION`.

    Runs inside the caller's write transaction.

    Raises:
        StoreError: The file's schema is newer than this code.
    """
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version not in (0, 1, 2, 3, 4, VERSION):
        raise StoreError(
            f"archive schema version {version} is not supported (expected at most {VERSION})"
        )
    old = version in (1, 2)
    if old:
        for column in ("speaker", "adjacent"):
            db.execute(f"ALTER TABLE messages ADD COLUMN {column} TEXT NOT NULL DEFAULT ''")
        db.execute(f"UPDATE messages AS m SET adjacent = {_ADJACENT}")
        for trigger in ("messages_ai", "messages_ad"):
            db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        db.execute("DROP TABLE IF EXISTS messages_fts")
    if version in (1, 2, 3, 4):
        have = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
        for column, kind in (("data", "TEXT"), ("archived_at", "REAL")):
            if column not in have:
                db.execute(f"ALTER TABLE messages ADD COLUMN {column} {kind}")
    for statement in _SCHEMA:
        db.execute(statement)
    if old:
        db.execute("INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')")
    if version == 1:
        _lexical.rebuild_terms(db)  # version 1 had no statistics
    if version != VERSION:
        db.execute(f"PRAGMA user_version = {VERSION}")


def check_current(db: sqlite3.Connection, path: str, marked: bool) -> None:
    """For a read-only open: is the file an archive of :data:`VERSION`, usable as it is?

    Args:
        db: The read-only connection.
        path: The file, for the error message.
        marked: The file carries the archive's application id (else it only holds
            archive tables, or none: a new or an older file).

    Raises:
        StoreError: The file is empty, or of another version (it is not migrated).
    """
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version == VERSION and (marked or _has_messages(db)):
        return
    if version == 0 and not _has_messages(db):
        raise StoreError(f"{path!r} is not a demote archive: it holds no archive tables")
    raise StoreError(
        f"{path!r} is an archive of schema version {version}, not {VERSION}; "
        "open it writable once to migrate it"
    )


def _has_messages(db: sqlite3.Connection) -> bool:
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'messages'")
    return row.fetchone() is not None
