"""Which demote component an SQLite file belongs to: each store recognises its own.

Every SQLite file demote writes carries its component's ``PRAGMA application_id`` (four
ASCII letters). A store opening a file checks it before writing anything:

* the store's own id: its file;
* another component's id: refused with a :class:`~demote.errors.StoreError` naming both
  (``demote inspect --state archive.db`` must not add state tables to an archive);
* no id (0): a new empty database, or a file written before ids existed, which is claimed
  only if every table in it is one of the store's own, with the columns the store's schema
  gives it (a table of its name with other columns is another program's); any other table
  means another program's database (or a foreign component's older file) and it is refused.

Some of this is decided before SQLite opens the file at all (:func:`connect`), from its
first 100 bytes, because opening can write: a file in WAL mode gains ``-wal`` and ``-shm``
files as soon as it is read. A file of another program (a foreign ``application_id``, or
foreign tables in a WAL file), or an empty file that was there before (not one that a
concurrent opener is creating, which is waited for briefly) is refused with a
:class:`~demote.errors.StoreError` naming it, and nothing is written: the file stays
byte-for-byte as it was, with nothing beside it. A WAL file without an id is inspected
through an ``immutable`` connection, which creates nothing.

Each store declares its tables' columns once (:func:`declare`), as the ``CREATE``
statements of its schema, run on a scratch in-memory database when first needed.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from demote.errors import StoreError

__all__ = [
    "ARCHIVE",
    "KINDS",
    "OUTBOX",
    "STATE",
    "check_kind",
    "claim_kind",
    "connect",
    "declare",
    "schema_columns",
]

STATE = 0x64656D6F  # "demo": the id the state store's first versioned files carry
ARCHIVE = 0x646D6172  # "dmar"
OUTBOX = 0x646D6F62  # "dmob"

#: The components, by application id.
KINDS = {STATE: "demote state store", ARCHIVE: "demote archive", OUTBOX: "demote outbox"}


#: SQLite's file header, and where a file keeps its application id and journal mode.
_MAGIC = b"SQLite format 3\x00"
_APP_AT = 68
_WAL_AT = 18  # the file format write version: 2 is WAL

#: Seconds an empty file is watched for a concurrent opener's first write.
EMPTY_PATIENCE = 1.0

#: Per component: table -> (columns it must have, columns it may have).
Columns = Mapping[str, tuple[frozenset[str], frozenset[str]]]
_DECLARED: dict[int, Callable[[], Columns]] = {}
_COLUMNS: dict[int, Columns] = {}


def declare(application_id: int, columns: Callable[[], Columns]) -> None:
    """Declare a component's tables' columns (called once, when its schema module loads)."""
    _DECLARED[application_id] = columns
    _COLUMNS.pop(application_id, None)


def schema_columns(statements: Iterable[str]) -> dict[str, frozenset[str]]:
    """The columns of each table that ``statements`` create (run on a scratch database)."""
    scratch = sqlite3.connect(":memory:")
    try:
        for statement in statements:
            for part in statement.split(";") if "BEGIN" not in statement else [statement]:
                if part.strip():
                    scratch.execute(part)
        return {
            table: frozenset(row[1] for row in scratch.execute(f'PRAGMA table_info("{table}")'))
            for table in _tables(scratch)
        }
    finally:
        scratch.close()


def _columns(application_id: int) -> Columns:
    if application_id not in _COLUMNS:
        declared = _DECLARED.get(application_id)
        _COLUMNS[application_id] = {} if declared is None else declared()
    return _COLUMNS[application_id]


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
    foreign = {t for t in _tables(db) if not any(_owned(t, o) for o in own)}
    if foreign:
        raise StoreError(
            f"{path!r} is not a {mine}: it holds other tables ({', '.join(sorted(foreign))})"
        )
    _check_columns(db, path, mine, _columns(application_id))
    return False


def _check_columns(db: sqlite3.Connection, path: str, mine: str, columns: Columns) -> None:
    """Refuse a table named like one of the store's whose columns are not the store's."""
    for table in sorted(_tables(db) & set(columns)):
        required, allowed = columns[table]
        if not required:
            continue  # not a table every version has: its migration judges it
        have = {str(row[1]) for row in db.execute(f'PRAGMA table_info("{table}")')}
        if not required <= have <= allowed:
            raise StoreError(
                f"{path!r} is not a {mine}: its table {table!r} has other columns "
                f"({', '.join(sorted(have))}); it was left unchanged"
            )


def _precheck(path: str, timeout: float, application_id: int | None) -> None:
    """Refuse, before SQLite opens it, a file that is not demote's (see the module doc)."""
    if path == ":memory:" or path.startswith("file:"):
        return
    try:
        size = os.stat(path).st_size
    except OSError:
        return  # a new file (or one SQLite will fail to open on its own)
    deadline = time.monotonic() + min(timeout, EMPTY_PATIENCE)
    while size == 0 and time.monotonic() < deadline:
        time.sleep(0.02)  # a concurrent opener writes its header within milliseconds
        size = os.stat(path).st_size
    if size == 0:
        raise StoreError(
            f"{path!r} is an empty file that demote did not create: it was left unchanged "
            "(remove it, or pass a path that does not exist yet)"
        )
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError:
        return  # SQLite reports it
    mine = KINDS.get(application_id or 0, "demote file")
    if not header.startswith(_MAGIC):
        return  # not a database: SQLite refuses it on the first read, which writes nothing
    app = int.from_bytes(header[_APP_AT : _APP_AT + 4], "big") if len(header) >= 72 else 0
    if app and (app not in KINDS or (application_id is not None and app != application_id)):
        theirs = KINDS.get(app, f"another program's database (application_id {app:#x})")
        raise StoreError(f"{path!r} is a {theirs}, not a {mine}; it was left unchanged")
    wal = len(header) > _WAL_AT and header[_WAL_AT] == 2
    if wal and app == 0 and not os.path.exists(path + "-wal"):
        _probe(path, mine, application_id)


def _probe(path: str, mine: str, application_id: int | None) -> None:
    """Judge a WAL file without an id through an immutable connection.

    That creates nothing: reading the file the usual way would create ``-wal`` and ``-shm``.
    """
    probe = sqlite3.connect(f"{Path(path).resolve().as_uri()}?immutable=1", uri=True)
    try:
        if application_id is not None:
            check_kind(probe, path, application_id, _columns(application_id))
            return
        own = {t for kind in list(_DECLARED) for t in _columns(kind)}
        foreign = {t for t in _tables(probe) if not any(_owned(t, o) for o in own)}
        if foreign:
            raise StoreError(
                f"{path!r} is not a {mine}: it holds other tables "
                f"({', '.join(sorted(foreign))}); it was left unchanged"
            )
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path!r} is not a {mine}: {exc}") from exc
    finally:
        probe.close()


def _owned(table: str, own: str) -> bool:
    return table == own or table.startswith(own + "_")


def claim_kind(db: sqlite3.Connection, application_id: int) -> None:
    """Mark the file as this component's (inside the caller's schema transaction)."""
    db.execute(f"PRAGMA application_id = {int(application_id)}")


def connect(
    path: str, timeout: float, *, read_only: bool = False, kind: int | None = None
) -> sqlite3.Connection:
    """A store's connection to ``path``: autocommit, shared across threads.

    ``read_only`` opens an existing file with ``mode=ro``: SQLite itself then refuses every
    write, and a missing file is an error instead of a new database. Before it opens the
    file, a file that is not demote's (of component ``kind``, if given) is refused.

    Raises:
        StoreError: The file is not demote's (it is left unchanged).
    """
    if not read_only:  # mode=ro writes nothing, and its own checks speak for it
        _precheck(path, timeout, kind)
    target = f"{Path(path).resolve().as_uri()}?mode=ro" if read_only else path
    return sqlite3.connect(
        target, timeout=timeout, check_same_thread=False, isolation_level=None, uri=read_only
    )
