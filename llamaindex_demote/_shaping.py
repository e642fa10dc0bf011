"""The request a ``DemotingMemory`` read (or a ``DemotingLLM`` call) sends, in one flow.

After the window is loaded: the recall (:func:`llamaindex_demote._recalling.recall_for`),
then the memory blocks (:func:`llamaindex_demote._block_slots.blocks_flow`), then
:func:`demote.request.compose` places them (``Parts.render``). Written once for sync and
async callers: the searches and block reads are operations of the flow.
"""

from __future__ import annotations

from llama_index.core.base.llms.types import ChatMessage

from demote.engine import Window
from demote.flow import Flow
from llamaindex_demote._block_slots import blocks_flow
from llamaindex_demote._recalling import is_user, recall_for
from llamaindex_demote._rendering import Parts
from llamaindex_demote.instrumentation import emit_events

__all__ = ["shape"]


def shape(parts: Parts, window: Window[ChatMessage], input: str | None) -> Flow[list[ChatMessage]]:
    """The messages to send for ``window``: with recall and the memory blocks, if any.

    Args:
        parts: The memory's parts.
        window: The loaded window.
        input: The caller's question, if it has one (a chat engine's, not stored yet).
    """
    recalling = None
    if parts.recalling is not None:
        recalling = yield from recall_for(parts, window, input)
    if parts.blocks is None:
        return parts.render(window, recalling)
    count = parts.message_tokens
    extra, events = yield from blocks_flow(
        parts.blocks, parts.demoter, window, input, count, is_user
    )
    if events:
        emit_events(events)
    return parts.render(window, recalling, extra)
