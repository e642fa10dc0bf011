"""``Mem0Recall``: reads a conversation's long tail back from mem0 (``search``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from demote.archive import args
from demote.archive.ranking import fit
from demote.errors import StoreError
from demote.flow import Flow
from demote.mem0._drivers import _Mem0, _results
from demote.mem0.config import KEY_FIELD, Namespace
from demote.records import Recalled
from demote.state.base import validate_conversation_id
from demote.window.tokens import Counter

__all__ = ["Mem0Recall"]


class Mem0Recall:
    """Reads memories back from mem0, strictly within one conversation's namespace.

    Args:
        memory: A ``mem0.Memory``, ``mem0.AsyncMemory``, ``mem0.MemoryClient`` or
            ``mem0.AsyncMemoryClient``.
        user_id: Fixed mem0 ``user_id`` (default namespace only).
        agent_id: Fixed mem0 ``agent_id`` (default namespace only).
        namespace: Conversation id to mem0 entity ids; must match the hook's.
        threshold: Minimum mem0 score (``None``: mem0's default, 0.1 in mem0 2.x).
        counter: Counts a memory's tokens for ``budget_tokens``: a counter name
            (``"approx"``, the default: characters / 4, rounded up) or a ``str -> int``.

    A memory mem0 extracted (rather than stored verbatim) comes back with role
    ``"memory"``; its index and key are the captured turn's, or ``-1`` and mem0's memory id
    for a batch the hook sent with ``infer=True``.
    """

    def __init__(
        self,
        memory: Any,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        namespace: Namespace | None = None,
        threshold: float | None = None,
        counter: str | Counter = "approx",
    ) -> None:
        self._threshold = None if threshold is None else args.weight("threshold", threshold)
        self._count = args.counter(counter)
        self._mem = _Mem0(memory, user_id, agent_id, namespace)

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        """The ``k`` memories of ``conversation_id`` most relevant to ``query``, best first.

        Args:
            conversation_id: The conversation whose memories are searched.
            query: Free text.
            k: How many memories mem0 is asked for.
            budget_tokens: Most tokens the returned memories may cost together (by
                ``counter``); one that does not fit is skipped and a later, shorter one
                may take its place. ``None``: no limit.

        Raises:
            ConversationIdError: ``conversation_id`` is unusable.
            ConfigError: ``query``, ``k`` or ``budget_tokens`` is not of its type or
                range (the message names it).
            StoreError: mem0 failed.
        """
        flow = self._search(*self._request(conversation_id, query, k, budget_tokens))
        return self._mem.run(flow, StoreError)

    async def asearch(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        """Async :meth:`search`.

        Raises:
            ConversationIdError: ``conversation_id`` is unusable.
            ConfigError: ``query``, ``k`` or ``budget_tokens`` is not of its type or
                range (the message names it).
            StoreError: mem0 failed.
        """
        flow = self._search(*self._request(conversation_id, query, k, budget_tokens))
        return await self._mem.arun(flow, StoreError)

    def _request(
        self, cid: object, query: object, k: object, budget: object
    ) -> tuple[dict[str, str], str, int, int | None]:
        """The checked arguments of a search (before any mem0 call)."""
        scope = self._mem.scope(validate_conversation_id(cid))
        return scope, args.query(query), args.top_k(k), args.budget(budget)

    def _search(
        self, scope: dict[str, str], query: str, k: int, budget: int | None
    ) -> Flow[list[Recalled]]:
        if k <= 0 or not query.strip():
            return []
        kwargs: dict[str, Any] = {"filters": self._mem.filters(scope), "top_k": k}
        if self._threshold is not None:
            kwargs["threshold"] = self._threshold
        result = yield self._mem.call("search", query, **kwargs)
        found = []
        for item in _results(result):
            meta = item.get("metadata") or {}
            if not _in_scope(item, scope) or not item.get("memory"):
                continue
            found.append(
                Recalled(
                    role=str(item.get("role") or meta.get("role") or "memory"),
                    text=str(item["memory"]),
                    index=int(meta.get("demote_index", -1)) if KEY_FIELD in meta else -1,
                    key=str(meta.get(KEY_FIELD) or item.get("id") or ""),
                    score=float(item.get("score") or 0.0),
                )
            )
        return fit(found[:k], budget, self._count)


def _in_scope(item: Mapping[str, Any], scope: Mapping[str, str]) -> bool:
    """Reject a result whose entity ids (where present) differ from ``scope``."""
    meta = item.get("metadata") or {}
    for name, value in scope.items():
        seen = item.get(name, meta.get(name))
        if seen is not None and seen != value:
            return False
    return True
