"""Opening a SQLite archive's file: claim it, set its pragmas, migrate it, check the model.

:func:`prepare` runs once, on the connection :class:`~demote.archive.sqlite.SQLiteArchive`
has just opened. A file holding tables other than :data:`OWN_TABLES` belongs to another
program and is refused; a read-only archive must already be of the current schema. The
version is read and migrated under ``BEGIN IMMEDIATE``, so of two processes opening a new
file one migrates and the other finds it done.
"""

from __future__ import annotations

import sqlite3

from demote.archive import _fts, _vectors
from demote.archive.embeddings import Embedder
from demote.archive.sqlite import _entities, _schema
from demote.backends.sqlite_kind import ARCHIVE, check_kind, claim_kind

__all__ = ["OWN_TABLES", "prepare"]

#: The archive's tables (and the prefixes of FTS5's shadow tables): a file holding others
#: belongs to another program and is refused.
OWN_TABLES = (
    "messages",
    "conversations",
    "terms",
    "speakers",
    "vectors",
    "settings",
    "erased",
    "entities",
    "entity_state",
)


def prepare(
    db: sqlite3.Connection,
    path: str,
    timeout: float,
    *,
    read_only: bool,
    entities: bool,
    embedder: Embedder | None,
    dims: int | None,
    reembed: bool,
) -> bool:
    """Make ``db`` ready for use; whether its vectors were cleared to be embedded again."""
    db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    mine = check_kind(db, path, ARCHIVE, OWN_TABLES)  # before WAL: it rewrites the header
    if read_only:
        _schema.check_current(db, path, mine)
        _fts.create_scratch(db)  # in the temp schema, which a read-only file still has
        return False
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA secure_delete = ON")  # deleted rows leave no bytes in free space
    _fts.create_scratch(db)
    db.execute("BEGIN IMMEDIATE")  # read the version only once no one else migrates
    try:
        if not check_kind(db, path, ARCHIVE, OWN_TABLES):  # another may have won
            claim_kind(db, ARCHIVE)
        _schema.create_or_migrate(db)
        if entities and _entities.create(db):
            _entities.rebuild(db)  # a file archived without the index gains it now
        cleared = False
        if embedder is not None:
            cleared = _vectors.check_model(db, embedder.name, dims, reembed)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return cleared
