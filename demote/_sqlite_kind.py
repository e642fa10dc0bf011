"""Which demote component an SQLite file belongs to: each store recognises its own.

Every SQLite file demote writes carries its component's ``PRAGMA application_id`` (four
ASCII letters). A store opening a file checks it before writing anything:

* the store's own id: its file;
* another component's id: refused with a :class:`~demote.errors.StoreError` naming both
  (``demote inspect --state archive.db`` must not add state tables to an archive);
* no id (0): a new empty file, or a file written before ids existed, which is claimed only
  if every table in it is one of the store's own; any other table means another program's
  database (or a foreign component's older file) and it is refused.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from demote.errors import StoreError

__all__ = ["ARCHIVE", "KINDS", "OUTBOX", "STATE", "check_kind", "claim_kind", "connect"]

STATE = 0x64656D6F  # "demo": the id the state store's first versioned files carry
ARCHIVE = 0x646D6172  # "dmar"
OUTBOX = 0x646D6F62  # "dmob"

#: The components, by application id.
KINDS = {STATE: "demote state store", ARCHIVE: "demote archive", OUTBOX: "demote outbox"}


def _tables(db: sqlite3.Connection) -> set[str]:
    rows = db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return {str(name) for (name,) in rows}


def check_kind(
    db: sqlite3.Connection, path: str, application_id: int, own_tables: Iterable[str]
) -> bool:
    """Is the file this store's? ``True``: claimed already; ``False``: free to claim.

    Raises:
        StoreError: The file belongs to another component or program (names both).
    """
    mine = KINDS[application_id]
    try:
        (app,) = db.execute("PRAGMA application_id").fetchone()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path!r} is not a {mine}: not an SQLite database ({exc})") from exc
    if app == application_id:
        return True
    if app != 0:
        theirs = KINDS.get(app, f"another program's database (application_id {app:#x})")
        raise StoreError(f"{path!r} is a {theirs}, not a {mine}")
    own = tuple(own_tables)
    foreign = {t for t in _tables(db) if not any(t == o or t.startswith(o + "_") for o in own)}
    if foreign:
        raise StoreError(
            f"{path!r} is not a {mine}: it holds other tables ({', '.join(sorted(foreign))})"
        )
    return False


def claim_kind(db: sqlite3.Connection, application_id: int) -> None:
    """Mark the file as this component's (inside the caller's schema transaction)."""
    db.execute(f"PRAGMA application_id = {int(application_id)}")


def connect(path: str, timeout: float, *, read_only: bool = False) -> sqlite3.Connection:
    """A store's connection to ``path``: autocommit, shared across threads.

    ``read_only`` opens an existing file with ``mode=ro``: SQLite itself then refuses every
    write, and a missing file is an error instead of a new database.
    """
    target = f"{Path(path).resolve().as_uri()}?mode=ro" if read_only else path
    return sqlite3.connect(
        target, timeout=timeout, check_same_thread=False, isolation_level=None, uri=read_only
    )
