"""The long tail in a LangGraph store: ``StoreHook`` writes it (``StoreRecall`` reads it).

LangGraph keeps an agent's long-term memory in a ``BaseStore`` (``InMemoryStore``,
``PostgresStore``, ...; passed as ``create_agent(..., store=...)``). :class:`StoreHook`
makes that store demote's long tail, and :class:`~langchain_demote.store_recall.StoreRecall`
reads it back for ``DemotingMiddleware(recall=...)`` and ``recall_tool(...)``::

    store = InMemoryStore()  # or the PostgresStore the agent already uses
    demoter = Demoter(SlidingWindow.last_turns(10), StoreHook(store))
    recall = StoreRecall(store)
    agent = create_agent(
        model, [recall_tool(recall)], checkpointer=checkpointer, store=store,
        middleware=[DemotingMiddleware(demoter, recall=recall, recall_role="human")],
    )

Theory of operation
-------------------
*Writing.* Each demoted message becomes one item (:mod:`langchain_demote._store_items`
gives the layout): in the namespace ``prefix + (conversation label,)``, under the
message's dedup key, with a value holding :data:`TEXT_FIELD` (what the store's index
embeds, named in each put's ``index=``), :data:`MESSAGE_FIELD` (the whole message as
JSON), ``role``, ``index``, ``position`` and ``conversation_id``. A batch is one ``batch`` call of
``PutOp`` s (``abatch`` when awaited). The engine delivers each message once per process
and re-delivers across processes and restarts at most with the same key, and a put under
the same key overwrites: every demoted message is one item, however often it arrives.

*Reading.* A store with a semantic index ranks by itself:
:meth:`~langchain_demote.store_recall.StoreRecall.search` asks it for the query's nearest
items in the conversation's namespace, filtered on its ``conversation_id``. A store
without one cannot rank text, so the search ranks the items with demote's archive ranking
(BM25 with stemming, coverage, the reply lift) over an in-memory copy that reads only
what is new from the store at each search (:mod:`langchain_demote._store_mirror`).
Either way only items of the asked conversation in its own namespace come back, best
first, cut to ``k`` and ``budget_tokens`` as the archives cut theirs.

*Sync and async.* Every operation is a flow (:mod:`demote.flow`) run by both
drivers: ``deliver`` calls ``store.batch``, ``adeliver`` awaits ``store.abatch``. Each
store call passes the store's circuit breaker, so a store that is down is skipped at once
until a probe finds it back; a store's error becomes
:class:`~demote.errors.StoreError`. The engine keeps a failed batch pending and retries
it; the middleware answers without recall when a search fails, and reports it.

*Erasing.* :meth:`StoreHook.erase` lists the conversation's namespace and deletes its
items until none is left, remembers the erase's fencing token (a late batch of a worker
whose lease the erase revoked is refused, in this process), and drops the in-memory copies
every ``StoreRecall`` of the same store holds of the conversation.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Literal

try:
    from langgraph.store.base import BaseStore, GetOp, PutOp
except ImportError as exc:  # pragma: no cover - depends on the environment
    from demote.errors import MissingExtraError

    raise MissingExtraError("langgraph", "langgraph") from exc

from demote.archive import args
from demote.erase import conversation_hash
from demote.errors import ArgumentTypeError, ConfigError, FencedOut, StoreError
from demote.flow import Call, Flow, drive_async, drive_sync
from demote.records import DemotedMessage, Demotion
from demote.state.base import validate_conversation_id
from langchain_demote._store_items import (
    DEFAULT_PREFIX,
    MESSAGE_FIELD,
    PAGE,
    TEXT_FIELD,
    Namespaces,
    Prefix,
    guarded,
    item_value,
    listing,
    ours,
)
from langchain_demote._store_mirror import mirrors_of

__all__ = ["DEFAULT_PREFIX", "MESSAGE_FIELD", "TEXT_FIELD", "StoreHook"]

# Items an erase lists (and deletes) per round, and the most rounds it makes.
_ERASE_PAGE = 1_000
_ERASE_ROUNDS = 10_000


class StoreHook:
    """A demotion hook writing each demoted message into a LangGraph store, once.

    Example::

        store = InMemoryStore(index={"dims": 256, "embed": embeddings})
        demoter = Demoter(SlidingWindow.last_turns(10), StoreHook(store, namespace=("memory",)))

    Args:
        store: Any LangGraph ``BaseStore`` (``InMemoryStore``, ``PostgresStore``, ...).
        namespace: The prefix of every item's namespace: a tuple of labels, or a callable
            giving it from the conversation id (per user:
            ``lambda cid: ("users", user_of(cid))``; it must always give the same prefix
            for one conversation). The conversation's own label follows it.
        media: How an item's message holds media: ``"reference"`` (default: URLs, ids
            and sizes, no bytes) or ``"bytes"``.

    Raises:
        ConfigError: ``store`` is not a ``BaseStore``, ``namespace`` is not a valid
            prefix or callable, or ``media`` is unknown.
    """

    def __init__(
        self,
        store: BaseStore,
        *,
        namespace: Prefix = DEFAULT_PREFIX,
        media: Literal["reference", "bytes"] = "reference",
    ) -> None:
        if not isinstance(store, BaseStore):
            raise ConfigError(f"store: expected a LangGraph BaseStore, got {store!r:.60}")
        if media not in ("reference", "bytes"):
            raise ConfigError(f"media: must be 'reference' or 'bytes', got {media!r:.40}")
        self.store = store
        self.namespaces = Namespaces.of_option(namespace)
        self.media: Literal["reference", "bytes"] = media
        self._fences: dict[str, int] = {}  # conversation hash -> fence of its last erase
        self._lock = threading.Lock()

    def namespace(self, conversation_id: str) -> tuple[str, ...]:
        """The namespace holding ``conversation_id``'s items.

        Raises:
            ConversationIdError: The conversation id is unusable.
            ConfigError: A ``namespace`` callable failed or gave no valid prefix.
        """
        return self.namespaces(conversation_id)

    # -- delivering ---------------------------------------------------------------------

    def deliver(self, batch: Demotion) -> None:
        """Put every message of ``batch`` in the store (one ``batch`` call).

        Raises:
            ArgumentTypeError: ``batch`` is not a Demotion of DemotedMessages.
            ConversationIdError: Its conversation id is unusable.
            FencedOut: Its fencing token is older than an erase of its conversation made
                through this hook; nothing is written.
            StoreError: The store failed (the engine retries the batch later), or was
                skipped as down (:class:`~demote.errors.StoreUnavailable`).
        """
        drive_sync(self._deliver(batch))

    async def adeliver(self, batch: Demotion) -> None:
        """Async :meth:`deliver` (``store.abatch``)."""
        await drive_async(self._deliver(batch))

    def _deliver(self, batch: Demotion) -> Flow[None]:
        if not isinstance(batch, Demotion):
            raise ArgumentTypeError(f"batch: must be a Demotion, got {type(batch).__name__}")
        cid = validate_conversation_id(batch.conversation_id)
        fence = args.fence(batch.fence)
        for message in batch.messages:
            if not isinstance(message, DemotedMessage) or not isinstance(message.key, str):
                raise ArgumentTypeError(
                    f"batch: messages must be DemotedMessage with str keys, got {message!r:.60}"
                )
        with self._lock:
            erased = self._fences.get(conversation_hash(cid))
        if erased is not None and fence is not None and fence < erased:
            raise FencedOut(
                f"LangGraph store: a batch of conversation {cid!r:.60} carries fencing token "
                f"{fence}, older than its erase (token {erased}); refused"
            )
        namespace = self.namespaces(cid)
        config = self.store.ttl_config
        ttl = config.get("default_ttl") if config else None  # what store.put would use
        ops = []
        for message in batch.messages:
            value = item_value(cid, message, self.media)
            index: list[str] | Literal[False] = [TEXT_FIELD] if value[TEXT_FIELD].strip() else False
            ops.append(PutOp(namespace, message.key, value, index=index, ttl=ttl))
        if ops:
            yield from guarded(self.store, "batch", (ops,), "store demoted messages")

    # -- what it holds ------------------------------------------------------------------

    def has_keys(self, conversation_id: str, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` the store holds as items of ``conversation_id``.

        The engine asks this after a history rewrite, to skip messages already stored.

        Raises:
            ConversationIdError: The conversation id is unusable.
            ArgumentTypeError: ``keys`` is not an iterable of str.
            StoreError: The store failed.
        """
        return drive_sync(self._has_keys(conversation_id, keys))

    async def ahas_keys(self, conversation_id: str, keys: Sequence[str]) -> set[str]:
        """Async :meth:`has_keys`."""
        return await drive_async(self._has_keys(conversation_id, keys))

    def _has_keys(self, conversation_id: str, keys: Sequence[str]) -> Flow[set[str]]:
        namespace = self.namespaces(conversation_id)
        wanted = args.keys(keys)
        found: set[str] = set()
        for start in range(0, len(wanted), PAGE):
            ops = [GetOp(namespace, key, False) for key in wanted[start : start + PAGE]]
            items = yield from guarded(self.store, "batch", (ops,), "look up keys")
            held = [item for item in items if item is not None]
            found.update(item.key for item in ours(held, namespace, conversation_id))
        return found

    # -- erasing ------------------------------------------------------------------------

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """Delete every item of ``conversation_id`` from the store.

        The conversation's namespace is listed and its items deleted until none is left
        (the user's own items in that namespace, if any, stay). The fence is remembered
        in this process only: a late batch from a worker elsewhere is not refused here.
        Every ``StoreRecall`` of this store drops its in-memory copy of the conversation.
        :meth:`demote.Demoter.erase` calls this for the hook.

        Args:
            conversation_id: The conversation.
            fence: The erase's fencing token: a later batch carrying an older one is
                refused (:class:`~demote.errors.FencedOut`) by this hook.
            keys: Unused (items are found by namespace); part of the tier protocol.

        Returns:
            How many items were deleted.

        Raises:
            ConversationIdError: The conversation id is unusable.
            StoreError: The store failed, or kept listing items it was told to delete.
        """
        return drive_sync(self._erase(conversation_id, fence, keys))

    async def aerase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """Async :meth:`erase` (``store.abatch``)."""
        return await drive_async(self._erase(conversation_id, fence, keys))

    def _erase(
        self, conversation_id: str, fence: int | None, keys: Sequence[str] | None
    ) -> Flow[int]:
        cid = validate_conversation_id(conversation_id)
        fence = args.fence(fence)
        if keys is not None:
            args.keys(keys)
        namespace = self.namespaces(cid)
        if fence is not None:
            with self._lock:
                h = conversation_hash(cid)
                self._fences[h] = max(fence, self._fences.get(h, fence))
        removed = 0
        last: frozenset[str] = frozenset()
        for _ in range(_ERASE_ROUNDS):
            items = yield from listing(self.store, namespace, cid, _ERASE_PAGE)
            if not items:
                break
            if frozenset(items) == last:
                raise StoreError(f"LangGraph store: {len(items)} items stayed after delete")
            last = frozenset(items)
            ops = [PutOp(namespace, key, None) for key in items]
            yield from guarded(self.store, "batch", (ops,), "erase a conversation's items")
            removed += len(items)
        for mirror in mirrors_of(self.store):  # the StoreRecalls' in-memory copies
            yield Call(mirror, "forget", (cid,), {})
        return removed
