"""``StoreRecall``: the items ``StoreHook`` wrote, read back for one conversation.

What the items hold and where they live is :mod:`langchain_demote.store`'s theory of
operation. A search reads only the asked conversation's items in its own namespace: with a
semantic index, the store's nearest items to the query (filtered on ``conversation_id``);
without one, demote's archive ranking over the namespace's items, through an in-memory
copy kept in step (:mod:`langchain_demote._store_mirror`). ``fetch`` reads one item by
key, for ``recall_tool``. Sync and async run one flow each (:mod:`demote.flow`);
every store call passes the store's breaker and a store's error is a
:class:`~demote.errors.StoreError`.
"""

from __future__ import annotations

import threading
import weakref
from typing import Literal

try:
    from langgraph.store.base import BaseStore, GetOp, Item, SearchOp
except ImportError as exc:  # pragma: no cover - depends on the environment
    from demote.errors import MissingExtraError

    raise MissingExtraError("langgraph", "langgraph") from exc

from demote.archive import args
from demote.archive.ranking import fit
from demote.errors import ArgumentTypeError, ConfigError
from demote.flow import Call, Flow, drive_async, drive_sync
from demote.kit import count, seconds
from demote.records import Recalled
from demote.state.base import validate_conversation_id
from demote.window.tokens import Counter
from langchain_demote._store_items import (
    DEFAULT_PREFIX,
    Namespaces,
    Prefix,
    guarded,
    ours,
    recalled,
)
from langchain_demote._store_mirror import Mirror

__all__ = ["StoreRecall"]


def _refresh(store: BaseStore) -> bool:
    """Whether a read refreshes TTLs: the store's own default (as its ``get`` decides)."""
    config = store.ttl_config
    return bool(config.get("refresh_on_read", True)) if config else True


class StoreRecall:
    """Recall over the items ``StoreHook`` wrote: semantic or lexical, one conversation.

    Give it to ``DemotingMiddleware(recall=...)`` (the items most relevant to the newest
    question go to the model before it) and to ``recall_tool(...)`` (the agent searches,
    and fetches a cleared tool result by its key).

    Args:
        store: The store the hook writes to, or ``None``: the store of the running
            LangGraph graph (``create_agent(..., store=store)``), read at each call.
        namespace: The hook's ``namespace`` (the same prefix or callable).
        ranking: ``"auto"`` (default): the store's semantic search when it has an index
            (``index_config``), else ``"lexical"``: demote's archive ranking over the
            conversation's items. ``"semantic"`` requires an index.
        counter: Counts a hit's tokens for ``budget_tokens``: a counter name
            (``"approx"``, the default) or a ``str -> int`` callable.
        scan_limit: Most items one listing of a conversation's namespace reads (in the
            store's listing order; ``PostgresStore`` lists the newest first).
        cached_conversations: Conversations whose items a lexical search keeps an
            in-memory copy of (the least recently searched are dropped first).
        relist: A lexical search reads only the items written since the one before; every
            ``relist`` seconds (and when a hit is gone from the store) it reads the
            conversation's whole namespace again (``0``: at every search).

    Raises:
        ConfigError: ``store`` is neither ``None`` nor a ``BaseStore``, ``"semantic"``
            ranking over a store without an index, or an option out of range.
    """

    def __init__(
        self,
        store: BaseStore | None = None,
        *,
        namespace: Prefix = DEFAULT_PREFIX,
        ranking: Literal["auto", "semantic", "lexical"] = "auto",
        counter: str | Counter = "approx",
        scan_limit: int = 10_000,
        cached_conversations: int = 64,
        relist: float = 60.0,
    ) -> None:
        if store is not None and not isinstance(store, BaseStore):
            raise ConfigError(f"store: expected a LangGraph BaseStore or None, got {store!r:.60}")
        if ranking not in ("auto", "semantic", "lexical"):
            raise ConfigError(
                f"ranking: must be 'auto', 'semantic' or 'lexical', got {ranking!r:.40}"
            )
        self.store = store
        self.ranking = ranking
        self.namespaces = Namespaces.of_option(namespace)
        self._count = args.counter(counter)
        self.scan_limit = count("scan_limit", scan_limit)
        self.cached_conversations = count("cached_conversations", cached_conversations)
        self.relist = seconds("relist", relist, zero=True)
        if store is not None:
            self._semantic(store)  # "semantic" without an index is refused now
        self._mirrors: weakref.WeakKeyDictionary[BaseStore, Mirror] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    # -- searching ----------------------------------------------------------------------

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        """The items of ``conversation_id`` most relevant to ``query``, best first.

        Args:
            conversation_id: The conversation whose namespace is searched; no other
                conversation's item is ever returned.
            query: Free text, only ever searched for (embedded, or split into words).
            k: How many hits at most.
            budget_tokens: Most tokens the hits may cost together (by ``counter``); a hit
                that does not fit is left out and a later, shorter one may take its
                place. ``None``: no limit.

        Returns:
            Each hit with its text (the indexed text: the message's, then its tool
            calls), position, key, score and whole message (``data``); empty for an
            empty query or ``k=0``.

        Raises:
            ConversationIdError: The conversation id is unusable.
            ConfigError: ``query``, ``k`` or ``budget_tokens`` is not of its type or in
                range (the message names it); ``store=None`` outside a LangGraph run, or
                in a graph without a store.
            StoreError: The store failed, or was skipped as down.
        """
        return drive_sync(self._search(conversation_id, query, k, budget_tokens))

    async def asearch(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        """Async :meth:`search` (``store.abatch``; the lexical copy works in a thread)."""
        return await drive_async(self._search(conversation_id, query, k, budget_tokens))

    def _search(
        self, conversation_id: str, query: str, k: int, budget: int | None
    ) -> Flow[list[Recalled]]:
        cid = validate_conversation_id(conversation_id)
        text, k, budget = args.query(query), args.top_k(k), args.budget(budget)
        store = self._store()
        namespace = self.namespaces(cid)
        if k == 0 or not text.strip():
            return []
        if self._semantic(store):
            op = SearchOp(namespace, {"conversation_id": cid}, k, 0, text, _refresh(store))
            results = yield from guarded(store, "batch", ([op],), "search")
            found: list[Item] = results[0]
            hits = [
                recalled(item, getattr(item, "score", None))
                for item in ours(found, namespace, cid)
                if getattr(item, "score", None) is not None  # not embedded: not a hit
            ]
            return fit(hits, budget, self._count, k=k)
        with self._lock:
            mirror = self._mirrors.get(store)
        if mirror is None:  # opening it is SQLite work: a worker thread's, when awaited
            mirror = yield Call(self, "_mirror", (store,), {})
        hits = yield from mirror.search(store, namespace, cid, (text, k, budget), self.scan_limit)
        return hits

    # -- fetching one message by key (the recall tool) ----------------------------------

    def fetch(self, conversation_id: str, key: str) -> Recalled | None:
        """The stored message of ``conversation_id`` under ``key``, or ``None``.

        What ``recall_tool`` reads when the model asks for a cleared tool result by the
        key its placeholder names. Another conversation's key is never found.

        Raises:
            ConversationIdError: The conversation id is unusable.
            ArgumentTypeError: ``key`` is not a ``str``.
            StoreError: The store failed, or was skipped as down.
        """
        return drive_sync(self._fetch(conversation_id, key))

    async def afetch(self, conversation_id: str, key: str) -> Recalled | None:
        """Async :meth:`fetch`."""
        return await drive_async(self._fetch(conversation_id, key))

    def _fetch(self, conversation_id: str, key: str) -> Flow[Recalled | None]:
        cid = validate_conversation_id(conversation_id)
        if not isinstance(key, str):
            raise ArgumentTypeError(f"key: must be a str, got {type(key).__name__}")
        store = self._store()
        namespace = self.namespaces(cid)
        if not key or "\x00" in key:  # no key the hook writes
            return None
        op = GetOp(namespace, key, _refresh(store))
        results = yield from guarded(store, "batch", ([op],), "fetch an item")
        held = ours([item for item in results if item is not None], namespace, cid)
        return recalled(held[0]) if held else None

    # -- the lexical copy ----------------------------------------------------------------

    def forget(self, conversation_id: str, *, store: BaseStore | None = None) -> None:
        """Drop the in-memory copy a lexical search keeps of one conversation.

        :meth:`~langchain_demote.store.StoreHook.erase` drops the copies of its store.

        Args:
            conversation_id: The conversation.
            store: Only the copy made from this store (``None``: from any store).
        """
        cid = validate_conversation_id(conversation_id)
        with self._lock:
            mirrors = [m for s, m in self._mirrors.items() if store is None or s is store]
        for mirror in mirrors:
            mirror.forget(cid)

    def close(self) -> None:
        """Close the in-memory copies (a later lexical search makes a new one)."""
        with self._lock:
            mirrors = list(self._mirrors.values())
            self._mirrors.clear()
        for mirror in mirrors:
            mirror.close()

    def _mirror(self, store: BaseStore) -> Mirror:
        with self._lock:
            mirror = self._mirrors.get(store)
            if mirror is None:
                mirror = Mirror(store, self._count, self.cached_conversations, self.relist)
                self._mirrors[store] = mirror
            return mirror

    def _store(self) -> BaseStore:
        """The store to read: the one given, or the running graph's."""
        if self.store is not None:
            return self.store
        from langgraph.config import get_store

        try:
            store = get_store()
        except RuntimeError as exc:
            raise ConfigError(
                "StoreRecall(store=None) reads the store of the running LangGraph graph, "
                "and was called outside one: pass the store"
            ) from exc
        if not isinstance(store, BaseStore):
            raise ConfigError(
                "StoreRecall(store=None): the running graph has no store; give the agent "
                "one (create_agent(..., store=store)) or pass it here"
            )
        self._semantic(store)
        return store

    def _semantic(self, store: BaseStore) -> bool:
        indexed = bool(getattr(store, "index_config", None))
        if self.ranking == "semantic" and not indexed:
            raise ConfigError(
                f"ranking='semantic': {type(store).__name__} has no index; give it one "
                "(index={'dims': ..., 'embed': ...}) or use ranking='lexical'"
            )
        return indexed if self.ranking == "auto" else self.ranking == "semantic"
