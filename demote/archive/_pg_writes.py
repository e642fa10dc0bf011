"""What the PostgreSQL archive writes: a delivery and the vectors ``embed_pending`` adds.

:class:`~demote.archive.postgres.PostgresArchive` checks the arguments and that it may
write; these are the operations' steps (:data:`~demote.archive._pg_ops.Steps`): the rows a
batch becomes, the model's call for the ones not stored yet, and the transaction that
stores them (:func:`demote.archive._pg_flows.deliver`), as the SQLite archive's are in
:mod:`demote.archive._sqlite_writes`.
"""

from __future__ import annotations

from typing import Literal

from demote.archive import _args, _options, _pg_flows, _pg_rows
from demote.archive._options import ContextFn
from demote.archive._pg_ops import Db, Embed, Steps
from demote.archive._pg_statements import Statements
from demote.archive.embeddings import Embedder
from demote.backends.postgres import Pools
from demote.records import Demotion
from demote.state._codec import storable_id

__all__ = ["deliver", "embed_pending"]


def deliver(
    pools: Pools,
    st: Statements,
    batch: Demotion,
    context: ContextFn | None,
    media: Literal["reference", "bytes"],
    embedder: Embedder | None,
) -> Steps[int]:
    """Store ``batch`` (known keys skipped), embedding the new messages first; how many."""
    cid = storable_id(batch.conversation_id)
    fence = _args.fence(batch.fence)
    rows = [_pg_rows.row(m, context, media) for m in batch.messages]
    if not rows:
        return 0
    vectors: dict[str, list[float]] = {}
    if embedder is not None:
        known = yield Db(pools, _pg_flows.has_keys(st, cid, [r.key for r in rows]))
        new = list({r.key: r for r in rows if r.key not in known}.values())
        if new:
            texts = [_options.embedded(r.speaker, r.text) for r in new]
            embedded = yield Embed(embedder, documents=texts)
            vectors = {r.key: v for r, v in zip(new, embedded, strict=True)}
    model = embedder.name if embedder is not None else ""
    flow = _pg_flows.deliver(st, cid, rows, fence, vectors, model)
    stored: int = yield Db(pools, flow, write=True)
    return stored


def embed_pending(pools: Pools, st: Statements, embedder: Embedder, batch_size: int) -> Steps[int]:
    """Embed the stored messages without a vector, ``batch_size`` at a time; how many."""
    done = 0
    while True:
        rows = yield Db(pools, _pg_flows.unembedded(st, batch_size))
        if not rows:
            return done
        texts = [_options.embedded(speaker, text) for _, text, speaker in rows]
        embedded = yield Embed(embedder, documents=texts)
        pairs = [(row[0], vector) for row, vector in zip(rows, embedded, strict=True)]
        yield Db(pools, _pg_flows.store_vectors(st, pairs, embedder.name), write=True)
        done += len(rows)
