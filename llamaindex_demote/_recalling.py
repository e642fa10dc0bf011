"""Recall on a read: what ``DemotingMemory.get`` adds to the window when it has ``recall=``.

The query is the caller's ``input``, else the newest stored user message; the recall
goes right after the question, or at the end when the question is not stored yet (a chat
engine appends it after the memory's messages). Where, how much, and when a search is
done again are the same for every adapter (:func:`demote.request.recall_flow`): twice
``recall_k`` hits are asked for (those the window shows are dropped), what is left is
fitted into the recall's token budget as the message is sent, and a question gets one
search until the window is cut. A search that fails gives the window alone: a
``degraded`` event says so, and the chat never sees the error.

Recall sits right after the question rather than at the head, so the prompt prefix
(pinned, summary, older kept messages) stays byte-identical between calls and provider
prompt caches keep hitting; a question gets one search until the window is cut. Recalled
text is never written to the chat store, so it is never demoted, archived or captured
again.

:func:`recall_for` is written once for sync and async reads: it yields the search, which
``drive_sync`` runs as ``search`` and ``drive_async`` as an awaited ``asearch``, or as
``search`` in a worker thread when the recall has no ``asearch``. The memory runs it (in
:func:`llamaindex_demote._shaping.shape`) inside its own instrumentation span, after
loading the window, so the load's and the recall's events are all in it.
"""

from __future__ import annotations

from llama_index.core.base.llms.types import ChatMessage

from demote.engine import Window
from demote.flow import Flow
from demote.request import Recalling, recall_flow
from llamaindex_demote._rendering import Parts
from llamaindex_demote.instrumentation import emit_events
from llamaindex_demote.messages import core_role, text_of

__all__ = ["is_user", "recall_for"]


def is_user(message: ChatMessage) -> bool:
    """Is ``message`` a user message (as the core reads its role)?"""
    return core_role(message) == "user"


def _role_text(message: ChatMessage) -> tuple[str, str]:
    return core_role(message), text_of(message)


def recall_for(
    parts: Parts, window: Window[ChatMessage], input: str | None
) -> Flow[Recalling | None]:
    """What the recall places in the request for ``window`` (``None``: nothing)."""
    settings = parts.recalling
    if settings is None:
        return None
    recalling, events = yield from recall_flow(
        settings,
        parts.demoter,
        window,
        is_user=is_user,
        text_of=text_of,
        key=_role_text,
        count=parts.recall_tokens,
        memo=parts.memo,
        query=input,
    )
    if events:
        emit_events(events)
    return recalling
