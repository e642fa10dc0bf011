"""Archive files as older versions of demote wrote them (their schema, frozen here)."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from demote.archive import _fts, _lexical
from demote.records import DemotedMessage

VERSION_2 = """
CREATE TABLE messages (
    id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL, idx INTEGER NOT NULL,
    role TEXT NOT NULL, text TEXT NOT NULL, context TEXT NOT NULL DEFAULT '',
    key TEXT NOT NULL, scope TEXT NOT NULL, UNIQUE (conversation_id, key)
);
CREATE INDEX messages_conversation_idx ON messages (conversation_id, idx);
CREATE VIRTUAL TABLE messages_fts USING fts5(
    scope, text, context,
    content='messages', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts (rowid, scope, text, context)
    VALUES (new.id, new.scope, new.text, new.context);
END;
CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, scope, text, context)
    VALUES ('delete', old.id, old.scope, old.text, old.context);
END;
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL UNIQUE, messages INTEGER NOT NULL
);
CREATE TABLE terms (
    conversation INTEGER NOT NULL, term TEXT NOT NULL,
    in_text INTEGER NOT NULL, in_any INTEGER NOT NULL,
    PRIMARY KEY (conversation, term)
) WITHOUT ROWID;
PRAGMA user_version = 2;
"""


def scope(conversation_id: str) -> str:
    return "c" + hashlib.blake2b(conversation_id.encode("utf-8"), digest_size=16).hexdigest()


def make_old_archive(
    path: Path,
    messages: Sequence[tuple[str, DemotedMessage]],
    version: int,
    context: Callable[[DemotedMessage], str | None] = lambda m: None,
) -> None:
    """An archive file of schema ``version`` (1 or 2) holding ``(conversation, message)``."""
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(VERSION_2)
    _fts.create_scratch(db)
    db.execute("BEGIN")
    for conversation_id, m in messages:
        row = (conversation_id, m.index, m.role, m.text, context(m) or "", m.key)
        db.execute(
            "INSERT INTO messages (conversation_id, idx, role, text, context, key, scope) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (*row, scope(conversation_id)),
        )
        _lexical.add_terms(db, conversation_id, [(row[3], row[4])])
    db.execute("COMMIT")
    if version == 1:
        db.executescript("DROP TABLE terms; DROP TABLE conversations; PRAGMA user_version = 1;")
    db.close()
