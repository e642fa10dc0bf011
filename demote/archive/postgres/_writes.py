"""What the PostgreSQL archive writes: a delivery and the vectors ``embed_pending`` adds.

:class:`~demote.archive.postgres.PostgresArchive` checks the arguments and that it may
write; these are the operations' steps (:data:`~demote.flow.Flow`): the rows a
batch becomes, the model's call for the ones not stored yet, and the transaction that
stores them (:func:`demote.archive.postgres._flows.deliver`), as the SQLite archive's are in
:mod:`demote.archive.sqlite._writes`.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

from demote.archive import args
from demote.archive.embeddings import Embedder
from demote.archive.options import ContextFn, _embedded
from demote.archive.postgres import _flows, _rows
from demote.archive.postgres._ops import Db, Embed
from demote.archive.postgres._statements import Statements
from demote.backends.postgres import Pools
from demote.flow import Flow
from demote.records import Demotion
from demote.state.base import validate_conversation_id

__all__ = ["deliver", "embed_pending"]


def deliver(
    pools: Pools,
    st: Statements,
    batch: Demotion,
    context: ContextFn | None,
    media: Literal["reference", "bytes"],
    embedder: Embedder | None,
) -> Flow[int]:
    """Store ``batch`` (known keys skipped), embedding the new messages first; how many."""
    cid = validate_conversation_id(batch.conversation_id)
    fence = args.fence(batch.fence)
    rows = [_rows.row(m, context, media) for m in batch.messages]
    if not rows:
        return 0
    vectors: dict[str, list[float]] = {}
    if embedder is not None:
        keys = [r.key for r in rows]
        known = yield Db(pools, lambda: _flows.has_keys(st, cid, keys))
        new = list({r.key: r for r in rows if r.key not in known}.values())
        if new:
            texts = [_embedded(r.speaker, r.text) for r in new]
            embedded = yield Embed(embedder, documents=texts)
            vectors = {r.key: v for r, v in zip(new, embedded, strict=True)}
    model = embedder.name if embedder is not None else ""
    stored: int = yield Db(
        pools, lambda: _flows.deliver(st, cid, rows, fence, vectors, model), write=True
    )
    return stored


def embed_pending(pools: Pools, st: Statements, embedder: Embedder, batch_size: int) -> Flow[int]:
    """Embed the stored messages without a vector, ``batch_size`` at a time; how many."""
    done = 0
    while True:
        rows = yield Db(pools, lambda: _flows.unembedded(st, batch_size))
        if not rows:
            return done
        texts = [_embedded(speaker, text) for _, text, speaker in rows]
        embedded = yield Embed(embedder, documents=texts)
        pairs = [(row[0], vector) for row, vector in zip(rows, embedded, strict=True)]
        yield Db(pools, partial(_flows.store_vectors, st, pairs, embedder.name), write=True)
        done += len(rows)
