"""``StoreRecall``'s lexical search: demote's archive ranking over a namespace's items.

A store without a semantic index cannot rank text. The archive can: BM25 with stemming,
how much of the query a message covers, the lift a reply gets from the question it
answers (:mod:`demote.archive._search` explains it). So a lexical search keeps an
in-memory :class:`~demote.archive.sqlite.SQLiteArchive` copy of the conversation's items
and asks it: the store's items are ranked exactly as the same messages in an archive
would be.

Theory of operation. The store is the truth (other processes write to it and erase from
it); the copy is a cache, kept for the ``cached`` conversations searched last. A search:

1. lists the items the copy lacks: the whole namespace the first time and every
   ``relist`` seconds (which also finds items that are gone, or were written at old
   positions after a history rewrite: the copy then starts over), else only the items
   whose ``index`` is above the highest the copy holds, which is what the hook wrote
   since (the engine delivers a conversation in order);
2. adds them to the copy and searches it;
3. reads its hits back from the store by key (one call): a hit the store no longer holds
   (erased, deleted by hand, in another process) makes the copy start over from a whole
   listing and the search run again, once. So a hit is always an item the store holds,
   returned as the store holds it, and a search costs two store calls that read only
   what is new, whatever the conversation's length.

``forget`` drops a conversation's copy, bytes included: ``StoreHook.erase`` calls it on
every copy made from its store (:func:`mirrors_of`).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from langgraph.store.base import BaseStore, GetOp, Item

from demote.archive.sqlite import SQLiteArchive
from demote.flow import Call, Flow
from demote.records import DemotedMessage, Demotion, Recalled
from demote.window.tokens import Counter
from langchain_demote._store_items import (
    MESSAGE_FIELD,
    TEXT_FIELD,
    guarded,
    listing,
    ours,
    recalled,
)

__all__ = ["Mirror", "mirrors_of"]

# The copies made from each store (weakly: a copy goes with its StoreRecall).
_BY_STORE: weakref.WeakKeyDictionary[BaseStore, weakref.WeakSet[Mirror]] = (
    weakref.WeakKeyDictionary()
)
_BY_STORE_LOCK = threading.Lock()


def mirrors_of(store: BaseStore) -> list[Mirror]:
    """Every live copy made from ``store``'s items in this process."""
    with _BY_STORE_LOCK:
        return list(_BY_STORE.get(store, ()))


def _demoted(item: Item) -> DemotedMessage:
    value = item.value
    message = value.get(MESSAGE_FIELD)
    data = dict(message) if isinstance(message, Mapping) else None
    text = str(data.get("text", "")) if data is not None else str(value[TEXT_FIELD])
    return DemotedMessage(
        role=value["role"], text=text, index=int(value["index"]), key=item.key, data=data
    )


@dataclass(frozen=True, slots=True)
class _Copy:
    """What the copy holds of one conversation."""

    keys: frozenset[str]
    last: int  # the highest index among them (-1: none)
    listed: float  # when the whole namespace was last listed (monotonic)


class Mirror:
    """An in-memory archive holding a copy of the conversations searched lately.

    Args:
        store: The store whose items it copies (not kept: it is only registered under it).
        counter: Counts a hit's tokens for ``budget_tokens``.
        cached: How many conversations' copies are kept (the oldest searched go first).
        relist: Seconds between two whole listings of a conversation's namespace.
        clock: Monotonic clock (for tests).
    """

    def __init__(
        self,
        store: BaseStore,
        counter: Counter,
        cached: int,
        relist: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.archive = SQLiteArchive(":memory:", counter=counter, media="bytes")
        self._cached = cached
        self._relist = relist
        self._clock = clock
        self._copies: OrderedDict[str, _Copy] = OrderedDict()
        self._lock = threading.Lock()
        with _BY_STORE_LOCK:
            _BY_STORE.setdefault(store, weakref.WeakSet()).add(self)

    def search(
        self,
        store: BaseStore,
        namespace: tuple[str, ...],
        cid: str,
        request: tuple[str, int, int | None],
        limit: int,
    ) -> Flow[list[Recalled]]:
        """The copy brought in step with the store, searched; hits read back from the store.

        Args:
            store: The store.
            namespace: The conversation's namespace.
            cid: The conversation.
            request: The query, ``k`` and ``budget_tokens``.
            limit: Most items one listing reads.
        """
        query, k, budget = request
        for whole in (False, True):
            yield from self._refresh(store, namespace, cid, limit, whole)
            hits: list[Recalled] = yield Call(
                self.archive, "search", (cid, query, k), {"budget_tokens": budget}
            )
            if not hits:
                return []
            ops = [GetOp(namespace, hit.key, False) for hit in hits]
            found = yield from guarded(store, "batch", (ops,), "read hits back")
            held = {
                item.key: item for item in ours([i for i in found if i is not None], namespace, cid)
            }
            if len(held) == len(hits):
                return [recalled(held[hit.key], hit.score) for hit in hits]
        # Still gone after a whole listing: the store dropped them meanwhile.
        return [recalled(held[hit.key], hit.score) for hit in hits if hit.key in held]

    def _refresh(
        self, store: BaseStore, namespace: tuple[str, ...], cid: str, limit: int, whole: bool
    ) -> Flow[None]:
        """Add to the copy what it lacks (see the module docstring); start it over if due."""
        now = self._clock()
        with self._lock:
            copy = self._copies.pop(cid, None)
        if copy is not None and (whole or now - copy.listed >= self._relist):
            yield Call(self.archive, "erase", (cid,), {})  # relisted whole: nothing stale stays
            copy = None
        after = None if copy is None else copy.last
        items = yield from listing(store, namespace, cid, limit, after)
        known = copy.keys if copy is not None else frozenset()
        new = sorted(
            (item for key, item in items.items() if key not in known),
            key=lambda item: int(item.value["index"]),
        )
        if new:
            batch = Demotion(cid, tuple(_demoted(item) for item in new))
            yield Call(self.archive, "deliver", (batch,), {})
        last = max((int(item.value["index"]) for item in new), default=-1)
        updated = _Copy(
            known | items.keys(),
            max(last, -1 if copy is None else copy.last),
            now if copy is None else copy.listed,
        )
        with self._lock:
            self._copies[cid] = updated
            evicted = []
            while len(self._copies) > self._cached:
                evicted.append(self._copies.popitem(last=False)[0])
        for old in evicted:
            yield Call(self.archive, "erase", (old,), {})

    def forget(self, conversation_id: str) -> None:
        """Drop the copy of one conversation (bytes included)."""
        with self._lock:
            held = self._copies.pop(conversation_id, None)
        if held is not None:
            self.archive.erase(conversation_id)

    def close(self) -> None:
        """Close the in-memory archive."""
        self.archive.close()
