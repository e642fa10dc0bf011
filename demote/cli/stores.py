"""Opening demote's stores from the command line: an SQLite file or a server URL.

:func:`open_store` is the one place where a ``--state``, ``--archive`` or ``--outbox``
value becomes a store, for every command (``inspect``, ``search``, ``migrate``, and
``erase`` may call it too):

- a file path: an ``SQLiteStateStore`` (``--state``) or ``SQLiteArchive``
  (``--archive``);
- a ``redis://``, ``rediss://`` or ``unix://`` URL: a ``RedisStateStore`` (``--state``
  only);
- a ``postgresql://`` or ``postgres://`` URL: a ``PostgresStateStore`` or
  ``PostgresArchive``.

``--outbox`` is a file (``SQLiteOutbox``). A URL is never turned into a path (so
``redis://host/0`` is never looked for as the file ``redis:/host/0``). What was opened
says what it reads (:attr:`OpenedStore.reads`: the file, the table, the key prefix) and
where, without a password. A read-only open (the default) creates and writes nothing: a
file must exist, a server must answer now, and a table must already be at this demote's
schema; a writable open (``migrate``, ``erase``) creates what is missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from demote._closing import Closing
from demote.errors import ConfigError

__all__ = ["Backend", "Kind", "OpenedStore", "backend_of", "open_store", "shown"]

#: Which store an option names.
Kind = Literal["state", "archive", "outbox"]
#: Where it lives.
Backend = Literal["sqlite", "redis", "postgresql"]

_REDIS = ("redis://", "rediss://", "unix://")
_POSTGRES = ("postgresql://", "postgres://")
_OPTION = {"state": "--state", "archive": "--archive", "outbox": "--outbox"}
#: Timeouts of a store the command line opens: a person waits, not a chat turn.
_SECONDS = 10.0


def backend_of(location: str | os.PathLike[str]) -> Backend:
    """``"redis"`` or ``"postgresql"`` for a server URL, ``"sqlite"`` for a file path."""
    text = os.fspath(location)
    if text.startswith(_POSTGRES):
        return "postgresql"
    if text.startswith(_REDIS):
        return "redis"
    return "sqlite"


def shown(location: str | os.PathLike[str]) -> str:
    """``location`` for messages: a URL without its password."""
    text = os.fspath(location)
    if backend_of(text) == "sqlite":
        return text
    parts = urlsplit(text)
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        text = parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()
    return text


@dataclass(frozen=True, slots=True)
class OpenedStore(Closing):
    """A store opened from a command-line value, and what it reads.

    Attributes:
        kind: ``"state"``, ``"archive"`` or ``"outbox"``.
        backend: ``"sqlite"``, ``"redis"`` or ``"postgresql"``.
        location: The file or URL, without a password.
        reads: What of it the store reads and writes: ``"file state.db"``, ``"table
            demote_state"``, ``"keys demote:*"``.
        store: The store (close it with :meth:`close`, or use this as a context manager).
    """

    kind: Kind
    backend: Backend
    location: str
    reads: str
    store: Any

    @property
    def where(self) -> str:
        """``location`` and what is read there, for one line of output."""
        if self.backend == "sqlite":
            return f"{self.location} (SQLite file)"
        return f"{self.location} ({self.reads})"

    def close(self) -> None:
        """Close the store."""
        self.store.close()


def open_store(
    kind: Kind,
    location: str | os.PathLike[str],
    *,
    table: str | None = None,
    prefix: str | None = None,
    read_only: bool = True,
) -> OpenedStore:
    """Open the store a command-line option names (see the module docstring).

    Args:
        kind: Which option: ``"state"``, ``"archive"`` or ``"outbox"``.
        location: A file path, or a ``redis://`` / ``rediss://`` / ``unix://`` URL (a
            state store), or a ``postgresql://`` / ``postgres://`` URL (a state store or
            an archive).
        table: A PostgreSQL store's table (``demote_state``, ``demote_archive`` by
            default).
        prefix: A Redis state store's key prefix (``demote:`` by default).
        read_only: Create and write nothing (``inspect``, ``search``); ``False`` for
            ``migrate`` and ``erase``, which may create a missing file or table.

    Raises:
        ConfigError: The location cannot hold that kind of store, a read-only file does
            not exist, or ``table`` / ``prefix`` was given for another backend.
        StoreError: The store cannot be opened: a server out of reach (read-only), a
            file or table of another kind or of another schema.
        MissingExtraError: The backend's extra is not installed.
    """
    option = _OPTION[kind]
    backend = backend_of(location)
    text = os.fspath(location)
    if table is not None and backend != "postgresql":
        raise ConfigError(f"{option}-table goes with a PostgreSQL {kind} (postgresql://...)")
    if prefix is not None and backend != "redis":
        raise ConfigError(f"{option}-prefix goes with a Redis state store (redis://...)")
    if backend == "redis" and kind != "state":
        raise ConfigError(f"{option}: Redis holds only a state store; give a file or URL")
    if backend == "postgresql" and kind == "outbox":
        raise ConfigError("--outbox: an outbox is an SQLite file")
    if backend == "sqlite":
        return _open_file(kind, option, text, read_only)
    if backend == "redis":
        from demote.state.redis import RedisStateStore

        redis_store = RedisStateStore(
            text,
            prefix="demote:" if prefix is None else prefix,
            socket_timeout=_SECONDS,
            socket_connect_timeout=_SECONDS,
            read_only=read_only,
        )
        return OpenedStore(kind, backend, shown(text), f"keys {redis_store.prefix}*", redis_store)
    store: Any
    if kind == "state":
        from demote.state.postgres import PostgresStateStore

        store = PostgresStateStore(
            text,
            table=table or "demote_state",
            timeout=_SECONDS,
            statement_timeout=_SECONDS,
            read_only=read_only,
        )
    else:
        from demote.archive.postgres import PostgresArchive

        store = PostgresArchive(
            text, table=table or "demote_archive", timeout=_SECONDS, read_only=read_only
        )
    return OpenedStore(kind, backend, shown(text), f"table {store.table}", store)


def _open_file(kind: Kind, option: str, path: str, read_only: bool) -> OpenedStore:
    if read_only and not Path(path).is_file():
        raise ConfigError(f"{option} {path}: no such file")
    store: Any
    if kind == "state":
        from demote.state.sqlite import SQLiteStateStore

        store = SQLiteStateStore(path, read_only=read_only)
    elif kind == "archive":
        from demote.archive.sqlite import SQLiteArchive

        store = SQLiteArchive(path, read_only=read_only)
    else:
        from demote.capture.outbox import SQLiteOutbox

        store = SQLiteOutbox(path, read_only=read_only)
    return OpenedStore(kind, "sqlite", path, f"file {path}", store)
