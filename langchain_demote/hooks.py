"""LangChain-specific ends of the long tail: a vector-store hook and an archive retriever.

:class:`VectorStoreHook` writes demoted messages into any LangChain ``VectorStore`` as
``Document`` objects whose ids are the messages' dedup keys, so a re-delivered batch
overwrites what it wrote before instead of adding copies. :func:`archive_retriever` reads
the long tail back as a ``BaseRetriever`` over anything with
``search(conversation_id, query, k)`` (``SQLiteArchive``, ``Mem0Recall``), for chains such
as ``RunnablePassthrough.assign(context=retriever)``.

Erase (:meth:`VectorStoreHook.erase`): a vector store deletes by id, and the ids are the
dedup keys, which the engine derives from the conversation's current history. Ids the
hook can also find by metadata (an ``InMemoryVectorStore``, or any store through
``find_ids=``) are deleted too; those of messages a rewritten history no longer holds
are reachable only that way.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore
from pydantic import ConfigDict

from demote.archive import args
from demote.engine import Demoter
from demote.erase import conversation_hash
from demote.errors import ArgumentTypeError, ConfigError, FencedOut
from demote.events import DemoteEvent
from demote.flow import Call, Flow, drive_async, drive_sync
from demote.hooks.base import Recall
from demote.kit import count, data_by_reference
from demote.records import (
    DemotedMessage,
    Demotion,
    Recalled,
    searchable_text,
)
from demote.state.base import validate_conversation_id
from langchain_demote.callbacks import dispatch_events

__all__ = ["DATA_FIELD", "ArchiveRetriever", "VectorStoreHook", "archive_retriever"]

#: The metadata field of a document that holds its whole message (JSON text of the
#: neutral form, :data:`demote.records.MESSAGE_DATA_KEYS`).
DATA_FIELD = "data"


def _document(conversation_id: str, message: DemotedMessage, media: str) -> Document:
    data = message.data
    if data is not None and media == "reference":
        data = data_by_reference(data)
    metadata: dict[str, Any] = {
        "conversation_id": conversation_id,
        "index": message.index,
        "role": message.role,
        "key": message.key,
    }
    if data is not None:  # JSON text: every vector store keeps a string in metadata
        metadata[DATA_FIELD] = json.dumps(data, ensure_ascii=False, default=repr)
    return Document(
        page_content=searchable_text(message.text, data), id=message.key, metadata=metadata
    )


class VectorStoreHook:
    """A demotion hook that stores demoted messages in a LangChain vector store.

    Each message becomes one ``Document`` (``page_content`` = its text, then one line per
    tool call, so a call is found by its name and arguments; metadata:
    ``conversation_id``, ``index``, ``role``, ``key`` and :data:`DATA_FIELD`, the whole
    message as JSON text) stored under ``id = key``.

    Example::

        store = InMemoryVectorStore(embeddings)
        demoter = Demoter(SlidingWindow.last_turns(10), VectorStoreHook(store))

    Args:
        vectorstore: Any ``VectorStore`` that honours ``ids`` in ``add_documents``.
        skip_empty: Leave out messages with nothing to embed (no text and no tool call).
        find_ids: Lists the ids of one conversation's documents in the store, found by
            their ``conversation_id`` metadata, for :meth:`erase` (Chroma:
            ``lambda cid: store.get(where={"conversation_id": cid})["ids"]``). For an
            ``InMemoryVectorStore`` the hook scans the store itself; otherwise, without
            it, erase deletes only the ids it is given.
        media: How the whole message in the metadata holds media: ``"reference"`` (the
            default: URLs, ids and sizes, no bytes) or ``"bytes"``.

    Raises:
        ConfigError: ``vectorstore`` is not a ``VectorStore``, ``find_ids`` not callable.
    """

    def __init__(
        self,
        vectorstore: VectorStore,
        *,
        skip_empty: bool = True,
        find_ids: Callable[[str], Iterable[str]] | None = None,
        media: Literal["reference", "bytes"] = "reference",
    ) -> None:
        if media not in ("reference", "bytes"):
            raise ConfigError(f"media: must be 'reference' or 'bytes', got {media!r:.40}")
        self.media = media
        if not isinstance(vectorstore, VectorStore):
            raise ConfigError(f"vectorstore: expected a VectorStore, got {vectorstore!r}")
        if find_ids is not None and not callable(find_ids):
            raise ConfigError(f"find_ids: {find_ids!r} is not callable")
        if not isinstance(skip_empty, bool):
            raise ArgumentTypeError(f"skip_empty: must be a bool, got {skip_empty!r:.40}")
        self.vectorstore = vectorstore
        self.skip_empty = skip_empty
        self.find_ids = find_ids
        self._fences: dict[str, int] = {}  # conversation hash -> fence of its last erase
        self._lock = threading.Lock()

    def _documents(self, batch: Demotion) -> list[Document]:
        if not isinstance(batch, Demotion):
            raise ArgumentTypeError(f"batch: must be a Demotion, got {type(batch).__name__}")
        fence = args.fence(batch.fence)
        with self._lock:
            erased = self._fences.get(
                conversation_hash(validate_conversation_id(batch.conversation_id))
            )
        if erased is not None and fence is not None and fence < erased:
            raise FencedOut(
                f"vector store: a batch of conversation {batch.conversation_id!r} carries "
                f"fencing token {batch.fence}, older than its erase (token {erased}); refused"
            )
        docs = [_document(batch.conversation_id, m, self.media) for m in batch.messages]
        return [d for d in docs if d.page_content.strip() or not self.skip_empty]

    def deliver(self, batch: Demotion) -> None:
        """Add the batch's messages to the vector store (ids = keys).

        Raises:
            FencedOut: The batch's fencing token is older than an erase of its
                conversation made through this hook (a worker whose lease the erase
                revoked); nothing is added.
        """
        docs = self._documents(batch)
        if docs:
            self.vectorstore.add_documents(docs, ids=[d.metadata["key"] for d in docs])

    async def adeliver(self, batch: Demotion) -> None:
        """Async :meth:`deliver` (``aadd_documents``)."""
        docs = self._documents(batch)
        if docs:
            await self.vectorstore.aadd_documents(docs, ids=[d.metadata["key"] for d in docs])

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        """Keys already stored (empty when the store cannot look documents up by id)."""
        conversation_id = validate_conversation_id(conversation_id)
        wanted = args.keys(keys)
        try:
            found = self.vectorstore.get_by_ids(wanted)
        except NotImplementedError:
            return set()
        return {
            d.id
            for d in found
            if d.id is not None and d.metadata.get("conversation_id") == conversation_id
        }

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int | None:
        """Delete the conversation's documents from the vector store, by id.

        The ids deleted are ``keys`` (what :meth:`demote.Demoter.erase` derives from the
        conversation's current history) and those found by metadata (``find_ids``, or a
        scan of an ``InMemoryVectorStore``). Where the store looks ids up
        (``get_by_ids``), only documents whose ``conversation_id`` metadata is this
        conversation are deleted, and counted. What it cannot reach: a message of a
        history rewritten since it was delivered (its key is no longer derived) in a
        store that cannot be searched by metadata. The fence is remembered in this
        process only: a late batch from a worker elsewhere is not refused here.

        Args:
            conversation_id: The conversation.
            fence: The erase's fencing token: a later batch carrying an older one is
                refused (:class:`~demote.errors.FencedOut`) by this hook.
            keys: Ids to delete (the conversation's dedup keys).

        Returns:
            How many documents were deleted, or ``None`` when the store cannot look ids
            up (every candidate id was then deleted, present or not).

        Raises:
            NotImplementedError: The store cannot delete (``delete`` is not implemented).
        """
        return drive_sync(self._erase(conversation_id, fence, keys))

    async def aerase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int | None:
        """Async :meth:`erase` (``aget_by_ids``, ``adelete``)."""
        return await drive_async(self._erase(conversation_id, fence, keys))

    def _erase(
        self, conversation_id: str, fence: int | None, keys: Sequence[str] | None
    ) -> Flow[int | None]:
        cid = validate_conversation_id(conversation_id)
        if fence is not None:
            with self._lock:
                h = conversation_hash(cid)
                self._fences[h] = max(fence, self._fences.get(h, fence))
        found: list[str] = yield Call(self, "ids_by_metadata", (cid,), {})
        ids = list(dict.fromkeys([*(str(k) for k in keys or ()), *found]))
        if not ids:
            return 0
        try:
            docs: list[Document] | None = yield Call(self.vectorstore, "get_by_ids", (ids,), {})
        except NotImplementedError:
            docs = None
        if docs is not None:
            ids = [d.id for d in docs if d.id and d.metadata.get("conversation_id") == cid]
            if not ids:
                return 0
        yield Call(self.vectorstore, "delete", (ids,), {})
        return None if docs is None else len(ids)

    def ids_by_metadata(self, conversation_id: str) -> list[str]:
        """The ids of the conversation's documents, found by their metadata.

        Empty when there are none, or when the store cannot be searched that way (see
        ``find_ids``).
        """
        if self.find_ids is not None:
            return [str(i) for i in self.find_ids(conversation_id)]
        if isinstance(self.vectorstore, InMemoryVectorStore):
            return [
                i
                for i, doc in list(self.vectorstore.store.items())
                if doc.get("metadata", {}).get("conversation_id") == conversation_id
            ]
        return []


class ArchiveRetriever(BaseRetriever):
    """Recalls archived messages of one conversation as ``Document`` objects.

    Each document's ``page_content`` is a recalled message's text; its metadata holds
    ``conversation_id``, ``role``, ``index``, ``key`` and ``score``. Each search is
    reported as a ``"demote.recalled"`` custom event in the retriever's run (count, keys,
    duration; never the query) and, with ``demoter``, to that Demoter's observers.

    Attributes:
        archive: Anything with ``search(conversation_id, query, k) -> list[Recalled]``.
        conversation_id: The conversation to search.
        k: How many messages to return at most.
        budget_tokens: At most this many tokens of text in all (``None``: no bound).
        demoter: The :class:`~demote.Demoter` whose observers hear of each recall.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    archive: Any
    conversation_id: str
    k: int = 5
    budget_tokens: int | None = None
    demoter: Demoter | None = None

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        began = time.perf_counter()
        options = {} if self.budget_tokens is None else {"budget_tokens": self.budget_tokens}
        hits: list[Recalled] = self.archive.search(self.conversation_id, query, self.k, **options)
        event = DemoteEvent.recalled(self.conversation_id, hits, time.perf_counter() - began)
        dispatch_events((event,), config={"callbacks": run_manager.get_child()})
        if self.demoter is not None:
            self.demoter.emit(event)
        return [
            Document(
                page_content=hit.text,
                metadata={
                    "conversation_id": self.conversation_id,
                    "role": hit.role,
                    "index": hit.index,
                    "key": hit.key,
                    "score": hit.score,
                    **({DATA_FIELD: hit.data} if hit.data is not None else {}),
                },
            )
            for hit in hits
        ]


def archive_retriever(
    archive: Recall,
    conversation_id: str,
    k: int = 5,
    *,
    budget_tokens: int | None = None,
    demoter: Demoter | None = None,
) -> ArchiveRetriever:
    """A LangChain retriever over the long tail of one conversation.

    Example::

        retriever = archive_retriever(SQLiteArchive("archive.db"), "user-42", k=3)
        chain = RunnablePassthrough.assign(context=itemgetter("question") | retriever)

    Args:
        archive: Anything with ``search(conversation_id, query, k)``, e.g.
            :class:`~demote.archive.sqlite.SQLiteArchive`.
        conversation_id: The conversation to search.
        k: How many messages to return at most (>= 1).
        budget_tokens: At most this many tokens of recalled text in all, best hits
            first (counted by the archive; ``None``: only ``k`` bounds it).
        demoter: Report each recall to this Demoter's observers too (it is always
            reported in the retriever's run as a ``"demote.recalled"`` custom event).

    Returns:
        An :class:`ArchiveRetriever`.

    Raises:
        ConversationIdError: ``conversation_id`` is unusable.
        ConfigError: ``archive`` has no ``search`` method, ``k < 1``, or ``demoter`` is
            not a Demoter.
    """
    cid = validate_conversation_id(conversation_id)
    if not callable(getattr(archive, "search", None)):
        raise ConfigError(f"archive: {archive!r} has no search() method")
    k = count("k", k)
    if budget_tokens is not None:
        budget_tokens = count("budget_tokens", budget_tokens)
    if demoter is not None and not isinstance(demoter, Demoter):
        raise ConfigError(f"demoter: expected a Demoter, got {type(demoter).__name__}")
    return ArchiveRetriever(
        archive=archive, conversation_id=cid, k=k, budget_tokens=budget_tokens, demoter=demoter
    )
