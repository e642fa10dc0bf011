"""``Mem0Hook``: a demotion hook that stores demoted messages in mem0, each once."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Literal

from demote.errors import ConfigError, HookError
from demote.flow import Flow
from demote.kit import data_by_reference
from demote.mem0._drivers import _KnownKeys, _Mem0, _Mem0Tier
from demote.mem0.config import CONVERSATION_FIELD, KEY_FIELD, KEYS_FIELD, Namespace
from demote.records import DemotedMessage, Demotion, searchable_text

__all__ = ["DATA_FIELD", "Mem0Hook"]

#: The metadata field holding a memory's whole message (JSON text of the neutral form).
DATA_FIELD = "demote_data"


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
        media: How the whole message kept in each memory's metadata holds media:
            ``"reference"`` (the default: URLs, ids and sizes, no bytes) or ``"bytes"``.

    Each memory's text is the message text with one line per tool call
    (:func:`demote.records.searchable_text`); with ``infer=False`` its metadata holds the
    whole message as JSON text under :data:`DATA_FIELD`. System messages and messages
    with nothing to index are skipped: mem0 ignores the former and the latter carry
    nothing to recall.

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
        media: Literal["reference", "bytes"] = "reference",
    ) -> None:
        if media not in ("reference", "bytes"):
            raise ConfigError(f"media: must be 'reference' or 'bytes', got {media!r:.40}")
        self._media = media
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

    def _deliver(self, batch: Demotion) -> Flow[None]:
        cid = batch.conversation_id
        scope = self._mem.scope(cid)
        shown = [self._shown(m) for m in batch.messages if m.role != "system"]
        todo = self._known.unknown(cid, [m for m in shown if m.text.strip()])
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
            own: dict[str, Any] = {KEY_FIELD: m.key, "demote_index": m.index}
            if m.data is not None:
                own[DATA_FIELD] = json.dumps(m.data, ensure_ascii=False, default=repr)
            meta = self._meta(cid, [m], own)
            yield self._mem.add_call(scope, [m], meta, False)
            self._known.add(cid, [m.key])  # at once: a later failure must not re-add it

    def _shown(self, m: DemotedMessage) -> DemotedMessage:
        """``m`` with the text mem0 gets (tool calls included) and its data as stored."""
        data = m.data
        if data is not None and self._media == "reference":
            data = data_by_reference(data)
        text = searchable_text(m.text, data)
        if text is m.text and data is m.data:
            return m
        return dataclasses.replace(m, text=text, data=data)

    def _meta(
        self, cid: str, messages: list[DemotedMessage], own: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            **self._metadata,
            CONVERSATION_FIELD: cid,
            "demote_index": messages[0].index,
            **own,
        }
