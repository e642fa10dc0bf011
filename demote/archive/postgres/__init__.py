"""The long tail for a fleet: a PostgreSQL archive with the SQLite archive's recall.

``PostgresArchive`` (extra ``demote[postgres]``) is :class:`~demote.archive.sqlite.SQLiteArchive`
in PostgreSQL: the same hook (``deliver`` / ``adeliver``, idempotent on each message's
dedup key, fenced against stale writers after an ``erase``), the same recall
(``search`` / ``asearch`` with ``k`` and ``budget_tokens``, ``messages``, ``count``,
``has_keys``) and the same options (``context=``, ``embeddings=``, the ranking weights),
shared by every worker of a deployment. The ranking is the SQLite archive's, fed from SQL:
full-text matches come from a ``tsvector`` column with a GIN index and are scored in the
database with ``ts_rank_cd`` inside FTS5's BM25 formula, then re-scored by the same pure
functions (:mod:`demote.archive._rank`): coverage, the lift of a reply to a matching
question, the neighbours' text, the speaker a query names, fusion with the nearest vectors,
``k`` and the token budget.

Where the two can answer differently (everything else is the same):

- **BM25's statistics.** FTS5 computes IDF and the average length over the whole file
  (every conversation in it); this archive over the conversation searched. With one
  conversation per archive the scores agree; with many, a conversation's ranking here
  does not depend on the others' messages (:mod:`demote.archive.postgres._statements`).
- **Stemming.** Snowball's ``porter`` stemmer here, FTS5's own implementation of the same
  Porter algorithm there; they agree on English words of three letters or more (FTS5
  leaves shorter ones unstemmed: "us" stays "us" there, becomes "u" here, so the document
  frequency of the stem "us" of "uses" differs).
- **Precision.** ``ts_rank_cd`` returns a 4-byte float, so scores agree to about 1e-7 and
  two hits that close may come in either order.
- **Many matches.** When a search matches more than 1,000 messages, both archives score
  only the newest 1,000: here by position in the conversation, there by order of
  delivery (the same unless messages were delivered out of order).
- **Text.** PostgreSQL text cannot hold NUL: a NUL in a message becomes U+FFFD, and a
  conversation id with one is refused (as the state stores refuse it). Only the first
  40,000 characters of a message's words are indexed (a ``tsvector`` holds at most 1 MB);
  all of it is stored and returned.
- **Erase.** Deleted rows leave PostgreSQL's pages when VACUUM reclaims them (autovacuum,
  or ``VACUUM`` / ``VACUUM FULL`` by the operator); until then, and in WAL and backups,
  their bytes remain, as with any PostgreSQL delete.

For a fleet: connections are pooled (a ``psycopg_pool`` pool, one async pool per event
loop), every operation has a client-side deadline and a server-side ``statement_timeout``,
a connection whose server went away is replaced (``Pools`` of
:mod:`demote.backends.postgres`), the schema
is versioned and migrated under an advisory lock (:mod:`demote.archive.postgres._schema`), writes
to one conversation are serialised by a transaction-scoped advisory lock, conversation ids
are only ever bound parameters, and every statement is scoped to one conversation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar, Unpack

from demote._closing import Closing
from demote.archive import args
from demote.archive.embeddings import Embedder
from demote.archive.options import (
    ArchiveKeywords,
    ArchiveOptions,
    _merged,
    _model_parts,
    _searcher,
)
from demote.archive.postgres import _flows, _rows, _schema, _search, _writes
from demote.archive.postgres._flows import SqlFlow
from demote.archive.postgres._ops import Db, Embed, Prepare
from demote.archive.postgres._statements import Statements
from demote.backends.postgres import Pools, table_name
from demote.errors import ArgumentTypeError, StoreError
from demote.flow import Flow, drive_async, drive_sync
from demote.records import Demotion, Recalled
from demote.state.base import validate_conversation_id

__all__ = ["PostgresArchive"]

T = TypeVar("T")


class PostgresArchive(Closing):
    """A demotion hook that stores demoted messages in PostgreSQL and recalls them.

    Thread-safe and shareable by every worker of a deployment (any number of processes
    and hosts may open the same table). Each method has an async twin (``adeliver``,
    ``asearch``, ...) that runs on psycopg's async pool, one per event loop.

    Example::

        archive = PostgresArchive("postgresql://app@db/app", context=speaker_and_date)
        demoter = Demoter(policy, archive, state=PostgresStateStore("postgresql://app@db/app"))
        hits = await archive.asearch("chat-1", "where did we go hiking?", k=5, budget_tokens=250)

    The recall options are :class:`~demote.archive.options.ArchiveOptions`, the same as
    :class:`~demote.archive.sqlite.SQLiteArchive`'s (same names, defaults and meaning;
    this class calls the connection pool ``pool``, so the candidate pool is only
    ``candidates``), so the same options rank the same way; the module docstring says
    where the two archives can differ. Give them as ``options=``, as keywords, or both
    (a keyword overrides that field of ``options``). The entity index is SQLite's only.

    Args:
        dsn: A libpq connection string or URL (``postgresql://user@host:5432/db``); the
            archive builds its pools from it. Give ``dsn`` or ``pool``.
        pool: An existing ``psycopg_pool.ConnectionPool`` (not closed by :meth:`close`).
        async_pool: An existing ``AsyncConnectionPool`` for the async twins (not closed by
            :meth:`close`); without it, pools are built like the sync one.
        table: The messages table (lowercase letters, digits, underscores; at most 41
            characters); the archive's other tables, its text search configuration and
            dictionary are named after it. Created or migrated when the archive opens.
        options: The recall options (default: ``ArchiveOptions()``).
        vectors: How vectors are stored, chosen when the table is made: ``"auto"``
            (pgvector's ``vector`` type when the ``vector`` extension is installed in
            the database, else ``real[]``), ``"array"`` or ``"pgvector"``.
        read_only: Open an existing archive for reading only (what ``demote inspect``
            and ``demote search`` do): nothing is created or migrated, the connections
            refuse writes, and ``deliver``/``erase`` raise :class:`StoreError`.
        timeout: Client-side deadline of one operation (waiting for a connection
            included), in seconds.
        connect_timeout: Seconds to establish a connection.
        statement_timeout: Server-side limit of one statement, in seconds.
        min_size: Connections each pool keeps open.
        max_size: Connections each pool may open.
        keepalives_idle: Seconds of idleness before TCP keepalive probes start.
        application_name: Shown in ``pg_stat_activity``.
        **recall: Any field of :class:`~demote.archive.options.ArchiveOptions`, by name
            (``context=``, ``embeddings=``, ``candidates=``, ...), over ``options``.

    Attributes:
        options: The recall options this archive ranks with, keywords applied.
        table: The messages table.
        read_only: Whether the archive was opened read-only.

    Raises:
        ConfigError: An option is out of range, or the vector storage asked for cannot
            be had.
        StoreError: PostgreSQL cannot be reached, or the table is not a compatible
            archive.
        EmbeddingModelChanged: The table holds another model's vectors (``"refuse"``).
        MissingExtraError: psycopg (``demote[postgres]``) or numpy (``embeddings=``) is
            not installed.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: Any = None,
        async_pool: Any = None,
        table: str = "demote_archive",
        options: ArchiveOptions | None = None,
        vectors: Literal["auto", "array", "pgvector"] = "auto",
        read_only: bool = False,
        timeout: float = 10.0,
        connect_timeout: float = 5.0,
        statement_timeout: float = 5.0,
        min_size: int = 1,
        max_size: int = 10,
        keepalives_idle: int = 30,
        application_name: str = "demote",
        **recall: Unpack[ArchiveKeywords],
    ) -> None:
        table = table_name(table, 41)
        self.options = _merged("PostgresArchive", options, recall)
        self._searcher = _searcher(self.options)
        self._media = self.options.media
        self._context = self.options.context
        on_model_change = self.options.on_model_change
        _schema.check_option(vectors)
        self.table = table
        self.read_only = read_only
        self._embedder, dims = _model_parts(self.options)
        self._matrices = _search.Matrices()
        self._st: Statements
        self._cleared = False  # the model changed: the vectors are to be embedded again

        def setup(conn: Any, repair: bool) -> None:
            layout = _schema.migrate(conn, table, vectors, read_only, repair)
            self._st = Statements(layout)
            if self._embedder is not None:
                reembed = on_model_change == "reembed" and not read_only
                check = _flows.check_model(self._st, self._embedder.name, dims, reembed)
                if _flows.execute(conn, check, write=True):
                    self._cleared = True

        self._pools = Pools(
            dsn,
            pool=pool,
            async_pool=async_pool,
            name=f"demote-{table}",
            setup=setup,
            timeout=timeout,
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
            min_size=min_size,
            max_size=max_size,
            keepalives_idle=keepalives_idle,
            application_name=application_name,
            read_only=read_only,
            wait_for_server=not read_only,
        )
        if self._cleared:
            drive_sync(self._ready())

    def _ready(self) -> Flow[None]:
        """The steps every operation starts with: the tables made or checked, once.

        Nothing when they are (the usual case). If the server was out of reach when the
        archive was made, the first operation that reaches it makes or checks them (so
        :attr:`_st` exists from then on), and embeds the messages again if that found
        another model's vectors.
        """
        if not self._pools.ready:
            yield Prepare(self._pools)
        if self._cleared:
            yield from _writes.embed_pending(self._pools, self._st, self._model(), 256)
            self._cleared = False

    # -- drivers ------------------------------------------------------------------------

    def _db(self, make: Callable[[], SqlFlow[T]], write: bool = False) -> Db:
        return Db(self._pools, make, write)

    def _model(self) -> Embedder:
        assert self._embedder is not None
        return self._embedder

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise StoreError(f"cannot {what}: the archive was opened read-only")

    # -- the hook -----------------------------------------------------------------------

    def _deliver(self, batch: Demotion) -> Flow[int]:
        if not isinstance(batch, Demotion):
            raise ArgumentTypeError(f"batch: must be a Demotion, got {type(batch).__name__}")
        self._writable("store a demotion")
        yield from self._ready()
        return (
            yield from _writes.deliver(
                self._pools, self._st, batch, self._context, self._media, self._embedder
            )
        )

    def deliver(self, batch: Demotion) -> None:
        """Store every message of ``batch`` in one transaction; known keys are skipped.

        With ``embeddings=``, the messages not stored yet are embedded first (one batch
        call), before the transaction.

        Raises:
            ConversationIdError: ``batch.conversation_id`` is empty, not a string, holds
                NUL or is longer than 16 KiB (nothing is stored).
            FencedOut: ``batch.fence`` is older than the conversation's last
                :meth:`erase` (nothing is stored).
            EmbeddingError: The model failed (nothing is stored).
            EmbeddingModelChanged: The vectors' dimensions differ from the stored ones.
            StoreError: PostgreSQL failed or timed out; nothing of the batch is stored.
        """
        drive_sync(self._deliver(batch))

    async def adeliver(self, batch: Demotion) -> None:
        """:meth:`deliver` on the async pool (the model's batch call in a thread)."""
        await drive_async(self._deliver(batch))

    def _embed_pending(self, batch_size: int) -> Flow[int]:
        self._writable("embed messages")
        if self._embedder is None:
            return 0
        yield from self._ready()
        return (yield from _writes.embed_pending(self._pools, self._st, self._embedder, batch_size))

    def embed_pending(self, batch_size: int = 256) -> int:
        """Embed the stored messages that have no vector yet; returns how many.

        Messages archived before ``embeddings=`` was set have none; they are recalled by
        text alone until this runs. Does nothing without ``embeddings=``.

        Raises:
            EmbeddingError: The model failed (what was embedded before stays).
            StoreError: PostgreSQL failed, or the archive is read-only.
        """
        return drive_sync(self._embed_pending(batch_size))

    async def aembed_pending(self, batch_size: int = 256) -> int:
        """:meth:`embed_pending` on the async pool."""
        return await drive_async(self._embed_pending(batch_size))

    # -- recall -------------------------------------------------------------------------

    def _search(
        self, conversation_id: str, query: str, k: int, budget_tokens: int | None
    ) -> Flow[list[Recalled]]:
        cid = validate_conversation_id(conversation_id)
        dense = self._embedder is not None
        request = self._searcher.request(cid, query, k, budget_tokens, dense)
        if request is None:
            return []
        yield from self._ready()
        vector = (yield Embed(self._model(), query=request.query)) if dense else None
        st, searcher, matrices = self._st, self._searcher, self._matrices

        def flow() -> SqlFlow[list[Recalled]]:
            found = _search.search(st, searcher, request, vector, matrices)
            return _flows.with_data(st, cid, found)

        hits: list[Recalled] = yield self._db(flow)
        return hits

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        """The stored messages of ``conversation_id`` most relevant to ``query``.

        The same arguments, answer and rules as
        :meth:`SQLiteArchive.search <demote.archive.sqlite.SQLiteArchive.search>`: the query
        is never interpreted as tsquery syntax; hits best first, each with its followers
        when ``after > 0``, at most ``k`` of them and within ``budget_tokens``.

        Raises:
            ConversationIdError: The conversation id is unusable.
            ConfigError: ``budget_tokens`` is negative or not an int.
            EmbeddingError: The model failed to embed the query.
            StoreError: PostgreSQL failed or timed out.
        """
        return drive_sync(self._search(conversation_id, query, k, budget_tokens))

    async def asearch(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        """:meth:`search` on the async pool; the query is embedded by the model's async method."""
        return await drive_async(self._search(conversation_id, query, k, budget_tokens))

    # -- reading and erasing ------------------------------------------------------------

    def _read(self, flow: Callable[[Statements], SqlFlow[T]]) -> Flow[T]:
        """One reading flow, made from the statements once the tables are ready."""
        yield from self._ready()
        st = self._st
        result: T = yield self._db(lambda: flow(st))
        return result

    def _messages(self, conversation_id: str) -> Flow[list[Recalled]]:
        cid = validate_conversation_id(conversation_id)
        return self._read(lambda st: _flows.messages(st, cid))

    def messages(self, conversation_id: str) -> list[Recalled]:
        """Every stored message of ``conversation_id``, in index order (score ``0``)."""
        return drive_sync(self._messages(conversation_id))

    async def amessages(self, conversation_id: str) -> list[Recalled]:
        """:meth:`messages` on the async pool."""
        return await drive_async(self._messages(conversation_id))

    def _count(self, conversation_id: str | None) -> Flow[int]:
        cid = None if conversation_id is None else validate_conversation_id(conversation_id)
        return self._read(lambda st: _flows.count(st, cid))

    def count(self, conversation_id: str | None = None) -> int:
        """How many messages are stored: in ``conversation_id``, or in all conversations."""
        return drive_sync(self._count(conversation_id))

    async def acount(self, conversation_id: str | None = None) -> int:
        """:meth:`count` on the async pool."""
        return await drive_async(self._count(conversation_id))

    def has_keys(self, conversation_id: str, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` are stored for ``conversation_id``.

        The engine asks after a history rewrite, to skip what is archived already.
        """
        return drive_sync(self._has_keys(conversation_id, keys))

    async def ahas_keys(self, conversation_id: str, keys: Iterable[str]) -> set[str]:
        """:meth:`has_keys` on the async pool."""
        return await drive_async(self._has_keys(conversation_id, keys))

    def _has_keys(self, conversation_id: str, keys: Iterable[str]) -> Flow[set[str]]:
        wanted, cid = args.keys(keys), validate_conversation_id(conversation_id)
        return self._read(lambda st: _flows.has_keys(st, cid, wanted))

    def conversations(self) -> list[str]:
        """The ids of every conversation with stored messages, sorted by code point."""
        return drive_sync(self._read(_flows.conversations))

    async def aconversations(self) -> list[str]:
        """:meth:`conversations` on the async pool."""
        return await drive_async(self._read(_flows.conversations))

    def _erase(self, conversation_id: str, fence: int | None) -> Flow[int]:
        self._writable("erase a conversation")
        cid, fence = validate_conversation_id(conversation_id), args.fence(fence)
        yield from self._ready()
        st = self._st
        removed: int = yield self._db(lambda: _flows.erase(st, cid, fence), write=True)
        return removed

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """Delete every stored message of ``conversation_id``, its vectors and statistics.

        The tier protocol of :mod:`demote.erase`. With ``fence``, later batches of the
        conversation carrying an older fencing token are refused
        (:class:`~demote.errors.FencedOut`): a worker whose delivery was in flight when
        the erase took the conversation over cannot write it back. The rows are deleted
        in one transaction; their bytes leave PostgreSQL's pages when VACUUM reclaims
        them.

        Args:
            conversation_id: The conversation.
            fence: The erase's fencing token.
            keys: Unused (messages are found by conversation); part of the protocol.

        Returns:
            How many messages were deleted.

        Raises:
            ConversationIdError: The conversation id is unusable.
            StoreError: PostgreSQL failed, or the archive is read-only.
        """
        return drive_sync(self._erase(conversation_id, fence))

    async def aerase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """:meth:`erase` on the async pool."""
        return await drive_async(self._erase(conversation_id, fence))

    def delete(self, conversation_id: str) -> int:
        """:meth:`erase` without a fence (``SQLiteArchive.delete``); returns how many."""
        return self.erase(conversation_id)

    def ensure_schema(self) -> None:
        """Create or upgrade the tables now, and make again any that is missing.

        Idempotent; what ``demote migrate`` runs ahead of a deployment. The archive does
        it by itself on first use and when it finds a table missing.

        Raises:
            StoreError: The server cannot be reached, the table holds a newer schema or
                another program's table, or the archive is read-only.
        """
        self._writable("make its tables")
        self._pools.repair("postgres archive")

    def close(self) -> None:
        """Close the pools this archive made (idempotent); later calls raise StoreError."""
        self._pools.close()
        self._matrices.clear()

    async def aclose(self) -> None:
        """Close this loop's async pool, then everything :meth:`close` closes."""
        await self._pools.aclose()
        self._matrices.clear()

    # -- fetching one message by key (the recall tool) ----------------------------------

    def _fetch(self, conversation_id: str, key: str) -> Flow[Recalled | None]:
        from demote.archive.render import recalled_from_columns

        cid = validate_conversation_id(conversation_id)
        if not isinstance(key, str):
            raise ArgumentTypeError(f"key: must be a str, got {type(key).__name__}")
        yield from self._ready()
        st, text = self._st, _rows.text(key)
        found = yield self._db(lambda: _flows.fetch(st, cid, text))
        return None if found is None else recalled_from_columns(found)

    def fetch(self, conversation_id: str, key: str) -> Recalled | None:
        """The stored message of ``conversation_id`` under ``key``, or ``None``.

        :meth:`SQLiteArchive.fetch <demote.archive.sqlite.SQLiteArchive.fetch>` in
        PostgreSQL: scoped to the conversation (another conversation's key is not found),
        the whole message in ``data`` when the row holds it.

        Raises:
            ConversationIdError: The conversation id is unusable.
            ArgumentTypeError: ``key`` is not a ``str``.
            StoreError: PostgreSQL failed or timed out.
        """
        return drive_sync(self._fetch(conversation_id, key))

    async def afetch(self, conversation_id: str, key: str) -> Recalled | None:
        """:meth:`fetch` on the async pool."""
        return await drive_async(self._fetch(conversation_id, key))
