"""``Mem0Hook``: a demotion hook that stores demoted messages in mem0, each once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from demote.errors import HookError
from demote.mem0._drivers import _Flow, _KnownKeys, _Mem0, _Mem0Tier
from demote.mem0.config import CONVERSATION_FIELD, KEY_FIELD, KEYS_FIELD, Namespace
from demote.records import DemotedMessage, Demotion

__all__ = ["Mem0Hook"]


class Mem0Hook(_Mem0Tier):
    """A demotion hook that writes demoted messages into mem0.

    Args:
        memory: A ``mem0.Memory``, ``mem0.AsyncMemory``, ``mem0.MemoryClient`` or
            ``mem0.AsyncMemoryClient``.
        user_id: Fixed mem0 ``user_id`` (default namespace only).
        agent_id: Fixed mem0 ``agent_id`` (default namespace only).
        infer: ``False`` (default) stores each message verbatim, one memory per message;
            ``True`` sends each batch to mem0's extractor (an LLM call per batch).
        metadata: Extra metadata stored on every memory.
        namespace: Conversation id to mem0 entity ids; see :func:`conversation_namespace`.
        check_existing: Ask mem0 which keys it already holds before writing (the
            at-least-once guard across processes). ``False`` trusts the in-process cache.
        max_cached_conversations: Conversations whose keys are cached in process.

    System messages and messages without text (tool-call-only turns) are skipped: mem0
    ignores the former and the latter carry nothing to recall.

    :meth:`demote.Demoter.erase` erases it as a tier (see :meth:`erase`).
    """

    def __init__(
        self,
        memory: Any,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        infer: bool = False,
        metadata: Mapping[str, Any] | None = None,
        namespace: Namespace | None = None,
        check_existing: bool = True,
        max_cached_conversations: int = 1024,
    ) -> None:
        self._mem = _Mem0(memory, user_id, agent_id, namespace)
        self._infer = infer
        self._metadata = dict(metadata or {})
        self._check_existing = check_existing
        self._known = _KnownKeys(max_cached_conversations)

    def deliver(self, batch: Demotion) -> None:
        """Store ``batch`` in mem0 (blocking); repeats of stored messages add nothing.

        Raises:
            HookError: mem0 failed; messages stored before the failure stay stored.
        """
        self._mem.run(self._deliver(batch), HookError)

    async def adeliver(self, batch: Demotion) -> None:
        """Store ``batch`` in mem0 without blocking the event loop.

        Raises:
            HookError: mem0 failed; messages stored before the failure stay stored.
        """
        await self._mem.arun(self._deliver(batch), HookError)

    def _deliver(self, batch: Demotion) -> _Flow[None]:
        cid = batch.conversation_id
        scope = self._mem.scope(cid)
        todo = self._known.unknown(
            cid, [m for m in batch.messages if m.role != "system" and m.text.strip()]
        )
        if todo and self._check_existing:
            field = KEYS_FIELD if self._infer else KEY_FIELD
            stored = yield from self._mem.stored_keys(
                self._known, cid, scope, field, [m.key for m in todo]
            )
            todo = [m for m in todo if m.key not in stored]
        if not todo:
            return
        if self._infer:
            keys = [m.key for m in todo]
            yield self._mem.add_call(scope, todo, self._meta(cid, todo, {KEYS_FIELD: keys}), True)
            self._known.add(cid, keys)
            return
        for m in todo:
            meta = self._meta(cid, [m], {KEY_FIELD: m.key, "demote_index": m.index})
            yield self._mem.add_call(scope, [m], meta, False)
            self._known.add(cid, [m.key])  # at once: a later failure must not re-add it

    def _meta(
        self, cid: str, messages: list[DemotedMessage], own: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            **self._metadata,
            CONVERSATION_FIELD: cid,
            "demote_index": messages[0].index,
            **own,
        }
