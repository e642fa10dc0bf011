"""What ``demote migrate`` does: create or upgrade demote's tables ahead of a deployment.

For each store given (``--state``, ``--archive``, ``--outbox``: files or URLs, as
:func:`demote.cli.stores.open_store` takes them) it looks at what is there (schema version,
tables, sequences, indexes, text search objects), opens the store for writing, which
creates a new file or table or upgrades an older schema in place, and makes again whatever
of its tables is missing (``ensure_schema``); then it looks again and prints what it found
and what it made. Idempotent: a second run makes nothing. The stores would do the same by
themselves at first use; running it before a deployment moves that work (and any error)
out of the first chat turns, and lets a database user without DDL rights run the workers.

Redis keeps no schema (keys are written as they are needed): there is nothing to do, and
the command says so after checking that the server answers. A schema newer than this
demote's is refused, as every store refuses it, and left as it was.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from demote.backends.postgres import table_name
from demote.cli.stores import Kind, backend_of, open_store
from demote.errors import ConfigError, StoreError

__all__ = ["Migration", "migrate_stores"]

#: What a PostgreSQL catalog entry is, by ``pg_class.relkind``.
_RELKINDS = {"r": "table", "S": "sequence", "i": "index", "v": "view"}


@dataclass(frozen=True, slots=True)
class Migration:
    """What ``demote migrate`` found and did to one store.

    Attributes:
        kind: ``"state"``, ``"archive"`` or ``"outbox"``.
        where: The store's file or URL (no password) and what of it is used.
        before: The schema version found (``None``: none recorded, or nothing there).
        after: The schema version now.
        made: The objects made (``"table demote_state"``, ``"index ..."``), in order.
        existed: Whether anything of the store was there before.
        schemaless: The store keeps no schema (Redis): nothing was done.
    """

    kind: str
    where: str
    before: int | None
    after: int | None
    made: tuple[str, ...]
    existed: bool
    schemaless: bool = False

    @property
    def outcome(self) -> str:
        """One phrase: created, upgraded, repaired, up to date, or nothing to do."""
        if self.schemaless:
            return "nothing to do: Redis keeps no schema (keys are written as needed)"
        at = "" if self.after is None else f" at schema {self.after}"
        if not self.existed:
            return f"created{at}"
        if self.before is not None and self.after is not None and self.before < self.after:
            return f"upgraded from schema {self.before} to {self.after}"
        if self.made:
            return f"made again what was missing{at}"
        return f"up to date{at}, nothing made"


def migrate_stores(
    out: IO[str],
    *,
    state: str | os.PathLike[str] | None = None,
    archive: str | os.PathLike[str] | None = None,
    outbox: str | os.PathLike[str] | None = None,
    state_table: str | None = None,
    state_prefix: str | None = None,
    archive_table: str | None = None,
) -> list[Migration]:
    """Create or upgrade the given stores' tables; print one line (and what was made) each.

    Raises:
        ConfigError: No store given, or an option goes with another backend.
        StoreError: A server cannot be reached, or a store holds a newer schema or
            another program's tables (that store is left as it was; the ones before it
            were migrated).
    """
    options: list[tuple[Kind, str | os.PathLike[str] | None, str | None, str | None]] = [
        ("state", state, state_table, state_prefix),
        ("archive", archive, archive_table, None),
        ("outbox", outbox, None, None),
    ]
    given = [(k, w, t, p) for k, w, t, p in options if w is not None]
    if not given:
        raise ConfigError("give at least one of --state, --archive, --outbox")
    done = []
    for kind, where, table, prefix in given:
        migration = _migrate(kind, where, table, prefix)
        out.write(f"{kind + ':':<8} {migration.where}: {migration.outcome}\n")
        if migration.made:
            out.write(f"{'':8}   made: {', '.join(migration.made)}\n")
        done.append(migration)
    return done


def _migrate(
    kind: Kind, location: str | os.PathLike[str], table: str | None, prefix: str | None
) -> Migration:
    backend = backend_of(location)
    if backend == "redis":
        with open_store(kind, location, prefix=prefix) as opened:  # checks it answers
            return Migration(kind, opened.where, None, None, (), True, schemaless=True)
    look = _Look(kind, os.fspath(location), table)
    before, found = look()
    opened = open_store(kind, location, table=table, prefix=prefix, read_only=False)
    try:
        ensure = getattr(opened.store, "ensure_schema", None)
        if ensure is not None:
            ensure()
        where = opened.where
    finally:
        opened.close()
    after, now = look()
    made = tuple(name for name in now if name not in found)
    return Migration(kind, where, before, after, made, bool(found))


class _Look:
    """What of a store exists: its schema version and its objects, read-only."""

    def __init__(self, kind: Kind, location: str, table: str | None) -> None:
        self.kind = kind
        self.location = location
        default = "demote_state" if kind == "state" else "demote_archive"
        self.table = table_name(table or default, 51 if kind == "state" else 41)

    def __call__(self) -> tuple[int | None, list[str]]:
        if backend_of(self.location) == "sqlite":
            return _sqlite_look(self.location)
        return _postgres_look(self.location, self.table)


def _sqlite_look(path: str) -> tuple[int | None, list[str]]:
    file = Path(path)
    if not file.is_file():
        return None, []
    try:
        db = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
        try:
            (version,) = db.execute("PRAGMA user_version").fetchone()
            rows = db.execute(
                "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY rowid"
            ).fetchall()
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    return (int(version) or None), [f"{kind} {name}" for kind, name in rows]


def _postgres_look(url: str, table: str) -> tuple[int | None, list[str]]:
    import psycopg

    like = table.replace("_", r"\_") + r"\_%"
    try:
        with psycopg.connect(url, connect_timeout=10, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT relkind::text, relname::text FROM pg_class WHERE relnamespace = "
                "current_schema()::regnamespace AND (relname = %s OR relname LIKE %s) "
                "ORDER BY oid",
                (table, like),
            ).fetchall()
            search = conn.execute(
                "SELECT 'text search configuration', cfgname::text FROM pg_ts_config WHERE "
                "cfgnamespace = current_schema()::regnamespace AND cfgname LIKE %s UNION ALL "
                "SELECT 'text search dictionary', dictname::text FROM pg_ts_dict WHERE "
                "dictnamespace = current_schema()::regnamespace AND dictname LIKE %s",
                (like, like),
            ).fetchall()
            version = None
            if f"table {table}_meta" in {f"{_RELKINDS.get(k, k)} {n}" for k, n in rows}:
                row = conn.execute(f"SELECT version FROM {table}_meta").fetchone()
                version = None if row is None else int(row[0])
    except psycopg.Error as exc:
        detail = " ".join(str(exc).split())
        raise StoreError(f"cannot reach postgres: {type(exc).__name__}: {detail}") from exc
    objects = [f"{_RELKINDS.get(kind, kind)} {name}" for kind, name in rows]
    return version, objects + [f"{kind} {name}" for kind, name in search]
