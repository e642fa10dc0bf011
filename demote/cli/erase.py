"""What ``demote erase`` does: forget one conversation in demote's SQLite files.

It builds a :class:`~demote.Demoter` over the given state store with the archive as its
hook and the outbox as one more tier, and runs :meth:`demote.Demoter.erase`: it waits for
a delivery in flight (up to ``--wait`` seconds) through the state store's lease, deletes
the conversation's state, archived messages and queued items (bytes included: see
:mod:`demote.erase`), and prints what each tier did, and how much it removed. The
application's own chat history (the inner store) is not in these files and is left alone.

Exit status (:func:`exit_status`): ``0`` when every tier erased; :data:`EXIT_INCOMPLETE`
(``1``) when one did not (it failed, or a delivery in flight outlived ``--wait``);
:data:`EXIT_NOT_FOUND` (``3``) when the erase was complete but none of the stores held the
conversation (a mistyped id, or one erased before); ``2`` is a user error, as for every
command.

Every file is checked before any is opened for writing: it must exist and be an SQLite
file of the kind its option names (a state store, an archive, an outbox), read-only, so a
mistaken option never adds tables to another component's file.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import IO, Any

from demote.archive.sqlite import SQLiteArchive
from demote.cli._table import table
from demote.engine.demoter import Demoter
from demote.erase import EraseReport
from demote.errors import ConfigError
from demote.state.sqlite import APPLICATION_ID, SQLiteStateStore
from demote.window.policy import SlidingWindow

__all__ = ["EXIT_INCOMPLETE", "EXIT_NOT_FOUND", "erase_stores", "exit_status", "file_kind"]

#: ``demote erase`` exit status: a tier did not erase (see the report), or was taken over.
EXIT_INCOMPLETE = 1
#: ``demote erase`` exit status: complete, but no store held the conversation.
EXIT_NOT_FOUND = 3

_KINDS = {"--state": "state store", "--archive": "archive", "--outbox": "outbox"}


def file_kind(path: str | os.PathLike[str]) -> str:
    """What demote file ``path`` is, read-only (nothing is written).

    Returns:
        ``"state store"``, ``"archive"``, ``"outbox"``, or what it is instead.

    Raises:
        ConfigError: ``path`` is not a file.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such file")
    try:
        db = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
        try:
            (app,) = db.execute("PRAGMA application_id").fetchone()
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        return f"not an SQLite database ({exc})"
    if app == APPLICATION_ID or "demote_state" in tables:
        return "state store"
    if {"messages", "messages_fts"} <= tables:
        return "archive"
    if {"outbox", "dead_letters"} <= tables:
        return "outbox"
    return "an SQLite file of something else" if tables else "an empty SQLite file"


def _check(option: str, path: str | os.PathLike[str]) -> Path:
    if not Path(path).is_file():
        raise ConfigError(f"{option} {path}: no such file")
    kind = file_kind(path)
    if kind != _KINDS[option]:
        raise ConfigError(f"{option} {path}: not a demote {_KINDS[option]} (it is {kind})")
    return Path(path)


def erase_stores(
    out: IO[str],
    conversation: str,
    *,
    state: str | os.PathLike[str],
    archive: str | os.PathLike[str],
    outbox: str | os.PathLike[str] | None = None,
    wait: float | None = None,
    err: IO[str] | None = None,
    state_table: str | None = None,
    archive_table: str | None = None,
) -> EraseReport:
    """Erase ``conversation`` from a state store, an archive and an outbox; print the report.

    Args:
        out: Where the report goes.
        conversation: The conversation id.
        state: The :class:`~demote.SQLiteStateStore` file, or the URL of a fleet's
            :class:`~demote.RedisStateStore` (``redis://``) or
            :class:`~demote.PostgresStateStore` (``postgresql://``).
        archive: The :class:`~demote.archive.sqlite.SQLiteArchive` file, or the URL of a
            :class:`~demote.PostgresArchive` (``postgresql://``).
        outbox: The :class:`~demote.SQLiteOutbox` file, if the application has one.
        wait: Seconds to wait for a delivery in flight (the state store's lease time,
            30 s, by default).
        err: Where notes go (standard error by default).
        state_table: A PostgreSQL state store's table (``demote_state`` by default).
        archive_table: A PostgreSQL archive's table (``demote_archive`` by default).

    Returns:
        The report; :func:`exit_status` makes the command's exit status of it.

    Raises:
        ConfigError: A file is missing or of the wrong kind, or two options name one file.
        ConversationIdError: The conversation id is unusable.
    """
    given = {"--state": state, "--archive": archive, "--outbox": outbox}
    urls = {o for o, p in given.items() if p is not None and _url(p)}
    if "--outbox" in urls or (archive is not None and _url(archive) == "redis"):
        raise ConfigError("--outbox and --archive take files or postgresql:// URLs as listed")
    paths = {o: _check(o, p) for o, p in given.items() if p is not None and o not in urls}
    if len({p.resolve() for p in paths.values()}) < len(paths):
        raise ConfigError("--state, --archive and --outbox must name different files")
    if state_table is not None and _url(state) != "postgresql":
        raise ConfigError("--state-table goes with a PostgreSQL state store (postgresql://...)")
    if archive_table is not None and _url(archive) != "postgresql":
        raise ConfigError("--archive-table goes with a PostgreSQL archive (postgresql://...)")
    from demote.capture.outbox import SQLiteOutbox

    with (
        _state_store(state, paths, state_table) as st,
        _archive(archive, paths, archive_table) as ar,
        Demoter(SlidingWindow.last_messages(1), ar, state=st) as demoter,
    ):
        box = SQLiteOutbox(paths["--outbox"]) if "--outbox" in paths else None
        try:
            report = demoter.erase(conversation, wait=wait, also=() if box is None else (box,))
        finally:
            if box is not None:
                box.close()
    _print(out, sys.stderr if err is None else err, report)
    return report


def exit_status(report: EraseReport) -> int:
    """``demote erase``'s exit status for ``report`` (see the module docstring)."""
    if not report.complete:
        return EXIT_INCOMPLETE
    return EXIT_NOT_FOUND if report.found is False else 0


def _url(value: str | os.PathLike[str]) -> str | None:
    """``"postgresql"`` or ``"redis"`` for a URL of a server, ``None`` for a file."""
    text = os.fspath(value)
    if text.startswith(("postgresql://", "postgres://")):
        return "postgresql"
    if text.startswith(("redis://", "rediss://", "unix://")):
        return "redis"
    return None


def _state_store(
    state: str | os.PathLike[str], paths: dict[str, Path], table: str | None
) -> SQLiteStateStore | Any:
    kind = _url(state)
    if kind == "postgresql":
        from demote.state.postgres import PostgresStateStore

        return PostgresStateStore(os.fspath(state), table=table or "demote_state")
    if kind == "redis":
        from demote.state.redis import RedisStateStore

        return RedisStateStore(os.fspath(state))
    return SQLiteStateStore(paths["--state"])


def _archive(
    archive: str | os.PathLike[str], paths: dict[str, Path], table: str | None
) -> SQLiteArchive | Any:
    if _url(archive) == "postgresql":
        from demote.archive.postgres import PostgresArchive

        return PostgresArchive(os.fspath(archive), table=table or "demote_archive")
    return SQLiteArchive(paths["--archive"])


def _print(out: IO[str], err: IO[str], report: EraseReport) -> None:
    rows = [["tier", "kind", "status", "removed"]]
    for t in report.touched:
        rows.append([t.tier, t.kind, t.status, "-" if t.removed is None else str(t.removed)])
    out.write(f"erase {report.conversation_id!r}\n")
    out.write("\n".join("  " + line for line in table(rows, text_columns=3)) + "\n")
    for t in report.touched:
        if t.error:
            out.write(f"{t.tier}: {t.error}\n")
    if report.took_over:
        out.write(
            "a delivery in flight did not end within --wait: its lease was revoked and it "
            "is refused by the archive and the outbox; erase again once it has ended\n"
        )
    if not report.complete:
        out.write("incomplete: see the tiers above; erase again\n")
    elif report.found is False:
        out.write(
            f"not found: none of these stores held {report.conversation_id!r}; nothing was erased\n"
        )
    else:
        out.write("complete\n")
    err.write(
        "demote erase: the application's own chat history (its inner store) is not in these "
        "files; erase it there too (the adapters' erase() does both)\n"
    )
