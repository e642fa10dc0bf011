"""The PostgreSQL archive's operations as flows: generators of statements, run twice.

A flow yields a :class:`Stmt`, is sent its rows, and returns its result; it does no I/O
itself. :func:`execute` runs one on a sync connection and :func:`aexecute` on an async
one (both inside a transaction when the flow writes), so every operation is written once
for both paths. Python work between statements (which rows were stored, the fence check,
the ranking) happens in the flow, with the connection held.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from demote.archive import _data, _vectors
from demote.archive._search import scope
from demote.archive.postgres._statements import Statements
from demote.backends.postgres import atransaction, transaction
from demote.errors import FencedOut
from demote.records import Recalled

__all__ = [
    "Row",
    "SqlFlow",
    "Stmt",
    "aexecute",
    "check_model",
    "count",
    "deliver",
    "erase",
    "execute",
    "fetch",
    "has_keys",
    "lock_key",
    "messages",
    "with_data",
]

T = TypeVar("T")
Rows = list[tuple[Any, ...]]


class Stmt(NamedTuple):
    """One statement: SQL, parameters, binary results, and whether psycopg may prepare it.

    ``prepare=False`` keeps a statement from being prepared on the server, whose generic
    plan would not see the parameters: a search's best plan depends on its terms.
    """

    sql: str
    params: Mapping[str, Any] | Sequence[Any] = ()
    binary: bool = False
    prepare: bool | None = None


#: An operation on one connection: yields statements, is sent their rows, returns its
#: result. Not a :data:`demote.flow.Flow`: it runs inside one (a ``_ops.Db``).
SqlFlow = Generator[Stmt, Rows, T]


def execute(conn: Any, flow: SqlFlow[T], write: bool) -> T:
    """Run ``flow`` on a sync psycopg connection (in a transaction when ``write``)."""
    with transaction(conn, write):
        rows: Any = None
        while True:
            try:
                stmt = flow.send(rows)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            cur = conn.execute(stmt.sql, stmt.params, prepare=stmt.prepare, binary=stmt.binary)
            rows = cur.fetchall() if cur.description else []


async def aexecute(conn: Any, flow: SqlFlow[T], write: bool) -> T:
    """:func:`execute` on an async psycopg connection."""
    async with atransaction(conn, write):
        rows: Any = None
        while True:
            try:
                stmt = flow.send(rows)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            cur = await conn.execute(
                stmt.sql, stmt.params, prepare=stmt.prepare, binary=stmt.binary
            )
            rows = await cur.fetchall() if cur.description else []


def lock_key(table: str, conversation_scope: str) -> int:
    """The advisory lock serialising writes to one conversation of one archive table."""
    digest = hashlib.blake2b(f"{table}\0{conversation_scope}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class Row(NamedTuple):
    """A message as stored: its columns, the words indexed for text and context, its JSON."""

    idx: int
    role: str
    text: str
    context: str
    speaker: str
    key: str
    words: str
    cwords: str
    data: str | None = None


def _ids(conversation_id: str) -> dict[str, str]:
    return {"scope": scope(conversation_id), "cid": conversation_id}


def deliver(
    st: Statements,
    conversation_id: str,
    rows: Sequence[Row],
    fence: int | None,
    vectors: Mapping[str, list[float]],
    model: str,
) -> SqlFlow[int]:
    """Store ``rows`` (known keys are skipped) with their ``vectors``; how many were new.

    Raises:
        FencedOut: ``fence`` is older than the conversation's last erase (nothing stored).
        EmbeddingModelChanged: The vectors' dimensions differ from the stored ones.
    """
    ids = _ids(conversation_id)
    yield Stmt(st.lock, {"lock": lock_key(st.layout.table, ids["scope"])})
    [(erased, conv)] = yield Stmt(st.open_conversation, {**ids, "fence": fence})
    if fence is not None and erased is not None and erased > fence:
        raise FencedOut(
            f"archive {st.layout.table!r}: a batch of conversation {conversation_id!r} "
            f"carries fencing token {fence}, older than its erase (token {erased}); refused"
        )
    columns = {name: [getattr(r, name) for r in rows] for name in Row._fields}
    stored = yield Stmt(
        st.insert, {**ids, **columns, "mark": f"{ids['scope']}:1", "at": time.time()}
    )
    if not stored:
        return 0
    embedded = [(row_id, vectors[key]) for row_id, key, _ in stored if key in vectors]
    if embedded:
        yield from store_vectors(st, embedded, model)
    near = sorted({idx + d for _, _, idx in stored for d in (-1, 0, 1)})
    fresh = [row_id for row_id, _, _ in stored]
    yield Stmt(st.refresh, {**ids, "near": near, "fresh": fresh, "conv": conv})
    return len(stored)


def store_vectors(
    st: Statements, embedded: Sequence[tuple[int, list[float]]], model: str
) -> SqlFlow[None]:
    """Store each stored message's vector (normalised); refuse other dimensions.

    Raises:
        EmbeddingModelChanged: The stored vectors have other dimensions (or model).
    """
    dims = len(embedded[0][1])
    settings: dict[str, str] = dict((yield Stmt(st.settings)))
    stored_dims = settings.get("embedding_dims")
    _vectors.compare_model(
        settings.get("embedding_model"),
        None if stored_dims is None else int(stored_dims),
        model,
        dims,
        reembed=False,
    )
    yield Stmt(st.record_model, {"name": model, "dims": str(dims)})
    packed = b"".join(_vectors.pack([vector for _, vector in embedded]))
    flat = _vectors.numpy().frombuffer(packed, dtype="<f4").tolist()
    ids = [row_id for row_id, _ in embedded]
    yield Stmt(st.insert_vectors, {"ids": ids, "flat": flat, "dims": dims})


def erase(st: Statements, conversation_id: str, fence: int | None) -> SqlFlow[int]:
    """Delete the conversation's messages, vectors and statistics; remember ``fence``."""
    ids = _ids(conversation_id)
    yield Stmt(st.lock, {"lock": lock_key(st.layout.table, ids["scope"])})
    [(deleted, _, _)] = yield Stmt(st.erase, {**ids, "fence": fence})
    return int(deleted)


def has_keys(st: Statements, conversation_id: str, keys: list[str]) -> SqlFlow[set[str]]:
    """Which of ``keys`` are stored for the conversation."""
    if not keys:
        return set()
    rows = yield Stmt(st.has_keys, {**_ids(conversation_id), "keys": keys})
    return {key for (key,) in rows}


def messages(st: Statements, conversation_id: str) -> SqlFlow[list[Recalled]]:
    """Every stored message of the conversation, in index order, whole where known."""
    rows = yield Stmt(st.messages, _ids(conversation_id))
    return [
        Recalled(role, text, idx, key, data=_data.row_data(role, text, data), at=at)
        for idx, role, text, key, data, at in rows
    ]


def with_data(
    st: Statements, conversation_id: str, found: SqlFlow[list[Recalled]]
) -> SqlFlow[list[Recalled]]:
    """The messages ``found`` returns, each with its whole form and archive time.

    One more statement on the same connection (and snapshot) as the search itself.
    """
    hits = yield from found
    if not hits:
        return hits
    keys = list({r.key for r in hits})
    rows = yield Stmt(st.whole, {**_ids(conversation_id), "keys": keys})
    by_key = {key: (data, at) for key, data, at in rows}
    out = []
    for r in hits:
        data, at = by_key.get(r.key, (None, None))
        out.append(dataclasses.replace(r, data=_data.row_data(r.role, r.text, data), at=at))
    return out


def count(st: Statements, conversation_id: str | None) -> SqlFlow[int]:
    """Messages stored in the conversation, or in all of them."""
    if conversation_id is None:
        rows = yield Stmt(st.count_all)
    else:
        rows = yield Stmt(st.count_one, _ids(conversation_id))
    return int(rows[0][0])


def conversations(st: Statements) -> SqlFlow[list[str]]:
    """The ids of every conversation with stored messages, sorted by code point."""
    rows = yield Stmt(st.conversations)
    return [cid for (cid,) in rows]


def check_model(st: Statements, name: str, dims: int | None, reembed: bool) -> SqlFlow[bool]:
    """Compare the archive's model with the stored vectors' (at open); ``True``: cleared.

    Raises:
        EmbeddingModelChanged: The table holds another model's vectors and ``reembed``
            is off.
    """
    settings = {str(name): value for name, value in (yield Stmt(st.settings))}
    stored_dims = settings.get("embedding_dims")
    changed = _vectors.compare_model(
        settings.get("embedding_model"),
        None if stored_dims is None else int(stored_dims),
        name,
        dims,
        reembed,
    )
    if changed:
        yield Stmt(st.clear_vectors)
    return changed


def fetch(st: Statements, conversation_id: str, key: str) -> SqlFlow[dict[str, Any] | None]:
    """The columns of the message of ``conversation_id`` under ``key`` (``None``: none)."""
    rows = yield Stmt(
        st.fetch, {"scope": scope(conversation_id), "cid": conversation_id, "key": key}
    )
    return dict(rows[0][0]) if rows else None


def unembedded(st: Statements, n: int) -> SqlFlow[Rows]:
    """Up to ``n`` stored messages without a vector: ``(id, text, speaker)``."""
    return (yield Stmt(st.unembedded, {"n": n}))
