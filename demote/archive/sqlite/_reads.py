"""What the SQLite archive reads back: recalled messages whole, counts, keys, one row.

A search's ranking is shared (:meth:`demote.archive._search.Searcher.flow`);
:func:`answer` gives it what it asks for from the file.

:class:`~demote.archive.sqlite.SQLiteArchive` holds the lock and validates the arguments;
these functions are the SQL run under it. Keys are looked up 500 at a time, under
SQLite's limit on bound parameters.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Sequence
from typing import Any

from demote.archive import _data, _lexical, _search
from demote.archive.sqlite import _entities
from demote.records import Recalled

__all__ = [
    "answer",
    "conversations",
    "count",
    "has_keys",
    "lookup",
    "messages",
    "row_by_key",
    "with_data",
]


def lookup(
    db: sqlite3.Connection,
    searcher: _search.Searcher,
    request: _search.Request,
    vector: Sequence[float] | None,
) -> list[Recalled]:
    """The hits of ``request``, whole, read in one snapshot."""
    db.execute("BEGIN")  # one snapshot; the scratch table is written in it
    try:
        found = answer(db, searcher, request, vector)
        found = with_data(db, request.conversation_id, found)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return found


def answer(
    db: sqlite3.Connection,
    searcher: _search.Searcher,
    request: _search.Request,
    vector: Sequence[float] | None,
) -> list[Recalled]:
    """Run ``request`` on ``db`` (inside a transaction) with the query's ``vector``.

    The searcher's flow (:meth:`~demote.archive._search.Searcher.flow`) ranks; this
    answers each of its needs from the SQLite file.
    """
    conversation_id = request.conversation_id
    steps = searcher.flow(request, vector)
    reply: Any = None
    while True:
        try:
            need = steps.send(reply)
        except StopIteration as stop:
            return list(stop.value)
        if isinstance(need, _search.Speakers):
            reply = _lexical.speakers(db, conversation_id)
        elif isinstance(need, _search.Lexical):
            reply = _lexical.score(
                db,
                conversation_id,
                _search.scope(conversation_id),
                need.terms,
                searcher.stems(db, need.terms),
                searcher.ranking,
                need.k,
            )
        elif isinstance(need, _search.Dense):
            reply = searcher.vectors.top(db, conversation_id, need.vector, need.n)
        elif isinstance(need, _search.Entities):
            reply = _entities.linked(db, conversation_id, need.terms, need.speakers)
        else:
            reply = _lexical.rows_at(db, conversation_id, need.indexes)


def with_data(
    db: sqlite3.Connection, conversation_id: str, found: list[Recalled]
) -> list[Recalled]:
    """``found`` with each message's whole form and archive time read from its row."""
    if not found:
        return found
    keys = list({r.key for r in found})
    rows: dict[str, tuple[str | None, float | None]] = {}
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        marks = ",".join("?" * len(chunk))
        for key, data, at in db.execute(
            f"SELECT key, data, archived_at FROM messages WHERE conversation_id = ? "
            f"AND key IN ({marks})",
            (conversation_id, *chunk),
        ):
            rows[key] = (data, at)
    out = []
    for r in found:
        data, at = rows.get(r.key, (None, None))
        out.append(dataclasses.replace(r, data=_data.row_data(r.role, r.text, data), at=at))
    return out


def messages(db: sqlite3.Connection, conversation_id: str) -> list[Recalled]:
    """Every stored message of ``conversation_id``, whole, in index order."""
    rows = db.execute(
        "SELECT idx, role, text, key, data, archived_at FROM messages "
        "WHERE conversation_id = ? ORDER BY idx, id",
        (conversation_id,),
    ).fetchall()
    return [
        Recalled(role, text, idx, key, data=_data.row_data(role, text, data), at=at)
        for idx, role, text, key, data, at in rows
    ]


def count(db: sqlite3.Connection, conversation_id: str | None) -> int:
    """How many messages are stored: in ``conversation_id``, or in all (``None``)."""
    if conversation_id is None:
        row = db.execute("SELECT count(*) FROM messages").fetchone()
    else:
        row = db.execute(
            "SELECT count(*) FROM messages WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()
    return int(row[0])


def has_keys(db: sqlite3.Connection, conversation_id: str, wanted: Sequence[str]) -> set[str]:
    """Which of ``wanted`` are stored for ``conversation_id``."""
    found: set[str] = set()
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ",".join("?" * len(chunk))
        found.update(
            key
            for (key,) in db.execute(
                f"SELECT key FROM messages WHERE conversation_id = ? AND key IN ({marks})",
                (conversation_id, *chunk),
            )
        )
    return found


def conversations(db: sqlite3.Connection) -> list[str]:
    """The ids of every conversation with stored messages, sorted."""
    rows = db.execute(
        "SELECT DISTINCT conversation_id FROM messages ORDER BY conversation_id"
    ).fetchall()
    return [conversation_id for (conversation_id,) in rows]


def row_by_key(db: sqlite3.Connection, conversation_id: str, key: str) -> dict[str, Any] | None:
    """The newest row of ``conversation_id`` under ``key``, by column name, or ``None``."""
    cursor = db.execute(
        "SELECT * FROM messages WHERE conversation_id = ? AND key = ? ORDER BY id DESC LIMIT 1",
        (conversation_id, key),
    )
    row = cursor.fetchone()
    names = [column[0] for column in cursor.description]
    return None if row is None else dict(zip(names, row, strict=True))
