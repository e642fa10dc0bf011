"""What the SQLite archive writes: a demoted message as a row, a delivery, new vectors.

:class:`~demote.archive.sqlite.SQLiteArchive` holds the lock, the transaction and the
model calls; these functions are the SQL run inside. :func:`store` is one delivery's
transaction body: the fence check, the rows (known keys are skipped) with their vectors,
and what is kept in step with them (term statistics, speakers, the neighbours' text, the
entity index). :func:`unembedded` and :func:`store_vectors` are ``embed_pending``'s two
steps.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from demote.archive import _data, _lexical, _vectors
from demote.archive.options import ContextFn, _describe
from demote.archive.sqlite import _entities, _erasure, _schema
from demote.kit import data_by_reference
from demote.records import DemotedMessage, searchable_text, storable_text

__all__ = ["Row", "row", "store", "store_model", "store_vectors", "unembedded"]


class Row(NamedTuple):
    conversation_id: str
    idx: int
    role: str
    text: str
    context: str
    key: str
    scope: str
    speaker: str
    data: str | None
    archived_at: float


def row(
    conversation_id: str,
    scope: str,
    message: DemotedMessage,
    context_fn: ContextFn | None,
    media: Literal["reference", "bytes"],
) -> Row:
    """``message`` as a row of ``conversation_id`` (``context_fn`` gives its context)."""
    context, speaker = _describe(context_fn, message)
    data = message.data
    if data is not None and media == "reference":
        data = data_by_reference(data)
    text = storable_text(searchable_text(message.text, data))
    return Row(
        conversation_id,
        int(message.index),
        str(message.role),
        text,
        storable_text(context),
        str(message.key),
        scope,
        storable_text(speaker),
        _data.stored_data(text, data),
        time.time(),
    )


def store(
    db: sqlite3.Connection,
    conversation_id: str,
    rows: Sequence[Row],
    fence: int | None,
    vectors: Mapping[str, bytes],
    model: tuple[str, int],
    entities: bool,
) -> None:
    """Store ``rows`` (known keys are skipped) with their packed ``vectors``.

    Runs in ``db``'s open transaction; ``model`` is the vectors' model name and dimensions.

    Raises:
        FencedOut: ``fence`` is older than the conversation's last erase.
        EmbeddingModelChanged: The vectors' dimensions differ from the stored ones.
    """
    _erasure.check_fence(db, conversation_id, fence)
    insert = (
        "INSERT OR IGNORE INTO messages (conversation_id, idx, role, text, context, "
        "key, scope, speaker, data, archived_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    stored: list[Row] = []
    for r in rows:
        cursor = db.execute(insert, r)
        if cursor.rowcount > 0:
            stored.append(r)
            if r.key in vectors:
                db.execute(
                    "INSERT INTO vectors (message, conversation_id, idx, vector) "
                    "VALUES (?, ?, ?, ?)",
                    (cursor.lastrowid, conversation_id, r.idx, vectors[r.key]),
                )
    if vectors:
        store_model(db, *model)
    _lexical.add_terms(db, conversation_id, [(r.text, r.context) for r in stored])
    db.executemany(
        "INSERT OR IGNORE INTO speakers (conversation_id, speaker) VALUES (?, ?)",
        {(conversation_id, r.speaker) for r in stored if r.speaker},
    )
    _schema.refresh_adjacent(db, conversation_id, {r.idx + d for r in stored for d in (-1, 0, 1)})
    if entities:
        _entities.index(
            db,
            conversation_id,
            [(r.idx, r.text) for r in stored],
            _lexical.speakers(db, conversation_id),
        )


def store_model(db: sqlite3.Connection, name: str, dims: int) -> None:
    """Refuse vectors of other dimensions than the stored ones; record the model."""
    _vectors.check_model(db, name, dims, reembed=False)
    _vectors.record_model(db, name, dims)


def unembedded(db: sqlite3.Connection, n: int) -> list[Any]:
    """Up to ``n`` stored messages without a vector: id, conversation, index, text, speaker."""
    return db.execute(
        "SELECT m.id, m.conversation_id, m.idx, m.text, m.speaker FROM messages AS m "
        "WHERE NOT EXISTS (SELECT 1 FROM vectors AS v WHERE v.message = m.id) "
        "ORDER BY m.id LIMIT ?",
        (n,),
    ).fetchall()


def store_vectors(db: sqlite3.Connection, rows: Sequence[Any], packed: Sequence[bytes]) -> None:
    """Store the packed vector of each of ``rows`` (from :func:`unembedded`) still stored."""
    db.executemany(
        "INSERT OR IGNORE INTO vectors (message, conversation_id, idx, vector) "
        "SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM messages WHERE id = ?)",
        [(r[0], r[1], r[2], blob, r[0]) for r, blob in zip(rows, packed, strict=True)],
    )
