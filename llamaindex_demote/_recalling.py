"""Recall on a read: what ``DemotingMemory.get`` adds to the window when it has ``recall=``.

The query is the caller's ``input``, else the newest stored user message
(:meth:`~llamaindex_demote._prompt.Parts.recall_query`). The search asks for twice
``recall_k`` hits, since those the window already shows are dropped; the rest go in one
message right before the question (:mod:`llamaindex_demote._prompt`). A search that fails
gives the window alone: a ``degraded`` event says so, and the chat never sees the error.

:func:`with_recall` is written once for sync and async reads: it yields the search, which
``drive_sync`` runs as ``search`` and ``drive_async`` as an awaited ``asearch``, or as
``search`` in a worker thread when the recall has no ``asearch``. The memory runs it
inside its own instrumentation span, after loading the window, so the load's and the
recall's events are all in it.
"""

from __future__ import annotations

import asyncio
import functools
import time

from llama_index.core.base.llms.types import ChatMessage

from demote.backends.flow import Flow
from demote.engine import Window
from demote.engine._erase_flow import Twin
from demote.hooks.base import Recall
from llamaindex_demote._prompt import Parts, assemble
from llamaindex_demote.instrumentation import emit_events

__all__ = ["with_recall"]


def with_recall(
    parts: Parts, conversation_id: str, window: Window[ChatMessage], input: str | None
) -> Flow[list[ChatMessage]]:
    """The messages to send: ``window``, with what the recall finds for the question."""
    ask = parts.recall_query(window, input)
    if ask is None:
        return assemble(window)
    recall, query, at = ask
    began = time.perf_counter()
    try:
        hits = yield _search(recall, conversation_id, query, parts)
    except Exception as exc:  # the window goes without recall: reported, never raised
        emit_events((parts.demoter.report_degraded(conversation_id, "recall", exc),))
        return assemble(window)
    return parts.recalled(window, hits, at, time.perf_counter() - began)


def _search(recall: Recall, conversation_id: str, query: str, parts: Parts) -> Twin:
    # Ask for more than k: hits the model already sees in the window are dropped.
    k, options = 2 * parts.recall_k, parts.search_options()
    search = functools.partial(recall.search, conversation_id, query, k, **options)
    asearch = getattr(recall, "asearch", None)
    if asearch is None:
        return Twin(search, functools.partial(asyncio.to_thread, search))
    return Twin(search, functools.partial(asearch, conversation_id, query, k, **options))
