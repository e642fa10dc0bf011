"""The embedded default long-tail store: a SQLite file with full-text and dense recall.

The schema and its migrations are in :mod:`demote.archive.sqlite._schema`. ``messages_fts`` is an
external-content FTS5 index over ``messages``, kept in step by triggers, so the text is
stored once. ``scope`` is a hex digest of the conversation id, indexed as one token: a
search matches ``scope`` *and* the query, so FTS5 itself narrows the posting lists to one
conversation, and the join on ``conversation_id`` keeps that strict. Conversation ids only
travel as bound parameters. ``context`` is a per-message string (a speaker, a date) from
the ``context`` callable (by default the speaker and date the message carries:
:mod:`demote.archive.context`); it is indexed with its own weight but never returned.
``adjacent`` indexes the text of the messages just before and after each one, with a
small weight. ``conversations`` and ``terms`` hold each conversation's message
count and, per index token, how many of its messages contain it (in the text; in the text
or context); :meth:`SQLiteArchive.deliver` keeps them in step in its transaction, so a
search reads statistics instead of counting.

Recall (:mod:`demote.archive._search` explains it): FTS5 BM25 candidates, re-scored by how
much of the query they cover and lifted by a matching question before them, fused with the
nearest vectors when the archive has an embedding model (:mod:`demote.archive._vectors`),
favouring a speaker the query names, cut to ``k`` hits and a token budget. The scoring is
pure (:mod:`demote.archive._rank`), so other stores can give the same answers.

Erase (:meth:`SQLiteArchive.erase`, :mod:`demote.archive.sqlite._erasure` explains it): the
conversation's rows, full-text entries, term statistics and vectors are deleted with
``secure_delete`` on, the full-text index is merged so no segment keeps its tokens, and
the WAL is truncated; its fencing token is remembered (by a hash of the id) so a stale
worker's late batch is refused. :func:`drop_terms`, the erase's first step, is public for
the benchmark that times an erase's parts (``python -m bench.erase_cost``).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Unpack

from demote._closing import Closing
from demote._validate import count, file_path, seconds
from demote.archive import _search, _vectors, args
from demote.archive._lexical import drop_terms
from demote.archive.options import (
    ArchiveKeywords,
    ArchiveOptions,
    _embedded,
    _merged,
    _model_parts,
    _searcher,
)
from demote.archive.options import ContextFn as _ContextFn
from demote.archive.sqlite import _erasure, _guard, _open, _reads, _writes
from demote.backends.sqlite_kind import connect
from demote.backends.wal import truncate_wal
from demote.errors import ArgumentTypeError, ConfigError, StoreError
from demote.records import Demotion, Recalled, storable_text
from demote.state.base import validate_conversation_id

__all__ = ["ContextFn", "SQLiteArchive", "SQLiteKeywords", "drop_terms"]

#: Gives the context indexed with a message (see :data:`demote.archive.options.ContextFn`).
ContextFn = _ContextFn


class SQLiteKeywords(ArchiveKeywords, total=False):
    """:class:`~demote.archive.options.ArchiveKeywords` and ``pool`` (``candidates``)."""

    pool: int


class SQLiteArchive(Closing):
    """A demotion hook that stores demoted messages in SQLite and recalls them.

    Thread-safe: one connection (WAL mode, ``busy_timeout``) behind a lock, so several
    threads may deliver and search at once; other processes may open the same file.

    Example::

        with SQLiteArchive("archive.db") as archive:
            archive.deliver(batch)
            hits = archive.search("chat-1", "where did we go hiking?", k=5, budget_tokens=250)

    With ``embeddings=`` every delivered message is embedded once, in one batch per
    delivery, inside :meth:`deliver`: wrap the archive in a ``Recorder`` to keep the model
    call off the request path. Each search embeds its query (one call).

    The recall options (``context=``, ``embeddings=``, the ranking weights, ``media=``, ...)
    are :class:`~demote.archive.options.ArchiveOptions`, which documents each of them:
    give them as ``options=``, as keywords, or both (a keyword overrides that field of
    ``options``). :class:`~demote.archive.postgres.PostgresArchive` takes the same ones.

    Args:
        path: The database file (created if missing; its directory must exist), or
            ``":memory:"``.
        options: The recall options (default: ``ArchiveOptions()``).
        timeout: Seconds to wait for a lock held by another connection.
        read_only: Open an existing archive without ever writing it (``demote search``,
            ``demote inspect``): a file of an older schema is refused instead of migrated,
            and :meth:`deliver`, :meth:`erase` and :meth:`embed_pending` raise
            :class:`~demote.errors.StoreError`.
        entities: Keep the entity index (:mod:`demote.archive.sqlite._entities`): the names each
            message uses, its he/she pronouns resolved to the last name used before
            them, built when messages are archived (a file archived without it gains it
            when opened). A question naming one of them lifts the messages linked to it
            by ``1 + entity_weight``, and a name linked to few messages lets them in even
            when they share no word with the question.
        entity_weight: The lift of the entity index (used with ``entities=True``).
        **recall: Any field of :class:`~demote.archive.options.ArchiveOptions`, by name
            (``context=``, ``embeddings=``, ``after=``, ...), over ``options``; and
            ``pool=``, this archive's name for ``candidates`` (give one of the two).

    Attributes:
        options: The recall options this archive ranks with, keywords applied.

    Raises:
        StoreError: The file cannot be opened, is not a compatible archive, or belongs to
            another component or program (a state store, an outbox: it is left as it was).
        ConfigError: An option is out of range or of the wrong type
            (:class:`~demote.errors.ArgumentTypeError`); the message names it.
        EmbeddingModelChanged: The file holds another model's vectors (``"refuse"``).
        EmbeddingError: The model failed while the archive checked or re-embedded.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        options: ArchiveOptions | None = None,
        timeout: float = 5.0,
        read_only: bool = False,
        entities: bool = False,
        entity_weight: float = 1.0,
        **recall: Unpack[SQLiteKeywords],
    ) -> None:
        target = file_path("path", path)
        if "pool" in recall:
            if "candidates" in recall:
                raise ConfigError("pool: the same option as candidates; give one of the two")
            recall["candidates"] = count("pool", recall.pop("pool"))
        self.options = _merged("SQLiteArchive", options, recall)
        timeout = seconds("timeout", timeout)
        if not isinstance(entities, bool):
            raise ArgumentTypeError(f"entities: must be a bool, got {entities!r:.40}")
        lift = args.weight("entity_weight", entity_weight)
        self._searcher = _searcher(self.options, entity_weight=lift if entities else 0.0)
        self._entities = entities
        self._media = self.options.media
        self._context = self.options.context
        self._embedder, dims = _model_parts(self.options)
        if not isinstance(read_only, bool):
            raise ArgumentTypeError(f"read_only: must be a bool, got {read_only!r:.40}")
        try:
            self._db = connect(target, timeout, read_only=read_only)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open archive {target!r}: {exc}") from exc
        self._guard = _guard.Guarded(self._db, read_only)
        try:
            cleared = _open.prepare(
                self._db,
                target,
                timeout,
                read_only=read_only,
                entities=entities,
                embedder=self._embedder,
                dims=dims,
                reembed=self.options.on_model_change == "reembed",
            )
            if cleared:
                self.embed_pending()
        except sqlite3.Error as exc:
            self._db.close()
            raise StoreError(f"cannot use archive {target!r}: {exc}") from exc
        except BaseException:
            self._db.close()
            raise

    # -- the hook -----------------------------------------------------------------------

    def deliver(self, batch: Demotion) -> None:
        """Store every message of ``batch`` in one transaction; known keys are skipped.

        With ``embeddings=``, the messages not stored yet are embedded first (one batch
        call), outside the archive's lock.

        Args:
            batch: Messages demoted from one conversation.

        Raises:
            ConversationIdError: ``batch.conversation_id`` is empty or not a string
                (nothing is stored).
            EmbeddingError: The model failed (nothing is stored).
            EmbeddingModelChanged: The model's vectors no longer have the stored
                dimensions (nothing is stored).
            FencedOut: ``batch.fence`` is older than the conversation's last erase (a
                worker whose lease the erase revoked); nothing is stored.
            StoreError: SQLite failed; nothing of the batch is stored.
        """
        if not isinstance(batch, Demotion):
            raise ArgumentTypeError(f"batch: must be a Demotion, got {type(batch).__name__}")
        conversation_id = validate_conversation_id(batch.conversation_id)
        fence = args.fence(batch.fence)
        scope = _search.scope(conversation_id)
        rows = [
            _writes.row(conversation_id, scope, m, self._context, self._media)
            for m in batch.messages
        ]
        if not rows:
            return
        vectors: dict[str, bytes] = {}
        dims = 0
        if self._embedder is not None:
            known = self.has_keys(conversation_id, (r.key for r in rows))
            new = list({r.key: r for r in rows if r.key not in known}.values())
            embedded = self._embedder.embed_documents([_embedded(r.speaker, r.text) for r in new])
            if embedded:
                packed = _vectors.pack(embedded)
                vectors = {r.key: blob for r, blob in zip(new, packed, strict=True)}
                dims = len(embedded[0])
        model = (self._embedder.name if self._embedder is not None else "", dims)
        with self._guard.transaction("store a demotion") as db:
            _writes.store(db, conversation_id, rows, fence, vectors, model, self._entities)

    def embed_pending(self, batch_size: int = 256) -> int:
        """Embed the stored messages that have no vector yet; returns how many.

        Messages archived before ``embeddings=`` was configured (or in a file migrated
        from an older version) have none; they are recalled by text alone until this
        runs. Does nothing without ``embeddings=``.

        Raises:
            EmbeddingError: The model failed (what was embedded before stays).
            StoreError: SQLite failed.
        """
        embedder = self._embedder
        if embedder is None:
            return 0
        done = 0
        while True:
            with self._guard.locked("read messages to embed") as db:
                rows = _writes.unembedded(db, batch_size)
            if not rows:
                return done
            embedded = embedder.embed_documents([_embedded(r[4], r[3]) for r in rows])
            packed = _vectors.pack(embedded)
            with self._guard.transaction("store vectors") as db:
                _writes.store_vectors(db, rows, packed)
                _writes.store_model(db, embedder.name, len(embedded[0]))
            done += len(rows)

    # -- recall -------------------------------------------------------------------------

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        """The stored messages of ``conversation_id`` most relevant to ``query``.

        Args:
            conversation_id: The conversation to search; no other is ever read.
            query: Free text; it is never interpreted as FTS5 syntax.
            k: How many hits to return at most (with ``after > 0`` each hit comes with
                the messages that follow it, so more messages than ``k`` may come back).
            budget_tokens: Most tokens the returned texts may cost together, counted
                by the archive's ``counter`` (``None``: no limit). Hits are taken best
                first; one that does not fit is left out and a later, shorter one may
                take its place.

        Returns:
            Best first (a hit's followers right after it, in conversation order); empty
            when the query has no searchable terms (and there are no embeddings) or
            nothing matches.

        Raises:
            ConversationIdError: The conversation id is empty or not a string.
            ArgumentTypeError: ``query`` is not a ``str``.
            ConfigError: ``k`` or ``budget_tokens`` is not an int in range.
            EmbeddingError: The model failed to embed the query.
            StoreError: SQLite failed.
        """
        embedder = self._embedder
        request = self._request(conversation_id, query, k, budget_tokens)
        if request is None:
            return []
        vector = embedder.embed_query(request.query) if embedder is not None else None
        return self._lookup(request, vector)

    async def asearch(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        """:meth:`search` for async callers: the same arguments, answer and errors.

        The query is embedded with the model's async method; the SQLite work runs in a
        worker thread.
        """
        request = self._request(conversation_id, query, k, budget_tokens)
        if request is None:
            return []
        embedder = self._embedder
        vector = await embedder.aembed_query(request.query) if embedder is not None else None
        return await asyncio.to_thread(self._lookup, request, vector)

    def _request(
        self, conversation_id: str, query: str, k: int, budget_tokens: int | None
    ) -> _search.Request | None:
        conversation_id = validate_conversation_id(conversation_id)
        dense = self._embedder is not None
        return self._searcher.request(conversation_id, query, k, budget_tokens, dense)

    def _lookup(self, request: _search.Request, vector: Sequence[float] | None) -> list[Recalled]:
        with self._guard.locked("search the archive") as db:
            return _reads.lookup(db, self._searcher, request, vector)

    # -- reading and housekeeping -------------------------------------------------------

    def messages(self, conversation_id: str) -> list[Recalled]:
        """Every stored message of ``conversation_id``, in index order (score ``0``).

        Each carries its whole form (``data``, ``None`` for a row archived before whole
        messages were) and when it was archived (``at``).
        """
        conversation_id = validate_conversation_id(conversation_id)
        with self._guard.locked("read the archive") as db:
            return _reads.messages(db, conversation_id)

    def count(self, conversation_id: str | None = None) -> int:
        """How many messages are stored: in ``conversation_id``, or in all conversations."""
        with self._guard.locked("count archived messages") as db:
            if conversation_id is not None:
                conversation_id = validate_conversation_id(conversation_id)
            return _reads.count(db, conversation_id)

    def has_keys(self, conversation_id: str, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` are stored for ``conversation_id``.

        The engine asks this after a history rewrite, to skip messages already archived.
        """
        conversation_id = validate_conversation_id(conversation_id)
        wanted = args.keys(keys)
        with self._guard.locked("look up archived keys") as db:
            return _reads.has_keys(db, conversation_id, wanted)

    def conversations(self) -> list[str]:
        """The ids of every conversation with stored messages, sorted."""
        with self._guard.locked("list archived conversations") as db:
            return _reads.conversations(db)

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """Delete every stored message of ``conversation_id``, bytes included.

        Its rows, full-text entries, term statistics, speakers and vectors go, with
        ``secure_delete`` on; the full-text index is merged so that no old segment keeps
        its words, and the WAL is checkpointed and truncated, so the text survives
        neither in the file nor in the WAL (see :mod:`demote.archive.sqlite._erasure`).
        :meth:`demote.Demoter.erase` calls this for an archive behind its hook.

        Args:
            conversation_id: The conversation.
            fence: The erase's fencing token: a later batch of the conversation carrying
                an older one is refused (:class:`~demote.errors.FencedOut`).
            keys: Unused (rows are found by conversation); part of the tier protocol.

        Returns:
            How many messages were deleted.

        Raises:
            ConversationIdError: The conversation id is empty or not a string.
            StoreError: SQLite failed (nothing was deleted), or the WAL stayed busy (another
                connection reading): the rows are deleted but their bytes may remain in
                the WAL until the next checkpoint; erase again to retry.
        """
        conversation_id = validate_conversation_id(conversation_id)
        fence = args.fence(fence)
        with self._guard.transaction("erase a conversation") as db:
            removed = _erasure.erase_rows(db, conversation_id, fence)
        self._searcher.vectors.forget(conversation_id)
        with self._guard.locked("truncate the WAL after an erase") as db:
            truncate_wal(db)
        return removed

    async def aerase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """:meth:`erase` for async callers (the SQLite work runs in a worker thread)."""
        return await asyncio.to_thread(self.erase, conversation_id, fence=fence, keys=keys)

    def delete(self, conversation_id: str) -> int:
        """Remove every stored message of ``conversation_id``; returns how many.

        The same as :meth:`erase` without a fencing token.
        """
        return self.erase(conversation_id)

    def close(self) -> None:
        """Close the connection; further calls raise :class:`StoreError`. Idempotent."""
        self._guard.close()

    # -- fetching one message by key (the recall tool) ----------------------------------

    def fetch(self, conversation_id: str, key: str) -> Recalled | None:
        """The stored message of ``conversation_id`` under ``key``, or ``None``.

        What an agent's recall tool reads when the model asks for a cleared tool result
        by the key its placeholder names (:func:`demote.window.clearing.placeholder_text`). Only
        ``conversation_id``'s messages are looked at: another conversation's key is not
        found. The whole message comes back in :attr:`Recalled.data <demote.records.Recalled>`
        when the row holds it (rows archived text-only give ``data=None``).

        Raises:
            ConversationIdError: The conversation id is empty or not a string.
            ArgumentTypeError: ``key`` is not a ``str``.
            StoreError: SQLite failed.
        """
        from demote.archive.render import recalled_from_columns

        conversation_id = validate_conversation_id(conversation_id)
        if not isinstance(key, str):
            raise ArgumentTypeError(f"key: must be a str, got {type(key).__name__}")
        with self._guard.locked("fetch an archived message") as db:
            columns = _reads.row_by_key(db, conversation_id, storable_text(key))
        return None if columns is None else recalled_from_columns(columns)

    async def afetch(self, conversation_id: str, key: str) -> Recalled | None:
        """:meth:`fetch` for async callers (the SQLite work runs in a worker thread)."""
        return await asyncio.to_thread(self.fetch, conversation_id, key)
