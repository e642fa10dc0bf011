"""Capture on a write: each user message a ``DemotingMemory`` stores goes to ``capture=``.

A write (``put``, ``put_messages`` and their async twins) appends to the chat store
(:func:`put`, :func:`store`, :func:`astore`), then captures the user messages it stored.

It is sent, once it is stored, as a :class:`~demote.records.CapturedTurn` whose key is the
dedup key of its position in the chat store, so a capture that is told a turn twice can
tell. A capture that fails does not fail the write: the message is stored, and a
``degraded`` event says so (to the instrumentation and the demoter's observers).
"""

from __future__ import annotations

from collections.abc import Sequence

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.storage.chat_store import BaseChatStore

from demote.records import CapturedTurn, make_key
from llamaindex_demote._rendering import Parts
from llamaindex_demote.instrumentation import emit_events
from llamaindex_demote.messages import core_role

__all__ = ["astore", "capture_users", "needs_index", "put", "store"]


def needs_index(parts: Parts, messages: Sequence[ChatMessage]) -> bool:
    """Whether storing ``messages`` captures one (so the write must know where they go)."""
    return parts.capture is not None and any(core_role(m) == "user" for m in messages)


def capture_users(
    parts: Parts, conversation_id: str, base: int, messages: Sequence[ChatMessage]
) -> None:
    """Send each user message of ``messages`` (stored from ``base`` on) to capture."""
    if parts.capture is None:
        return
    for i, message in enumerate(messages, base):
        if core_role(message) != "user":
            continue
        rec = parts.describe(message)
        key = make_key(conversation_id, i, rec.fingerprint)
        try:
            parts.capture.capture(CapturedTurn(conversation_id, "user", rec.text, i, key))
        except Exception as exc:  # the message is stored: the chat goes on without it
            emit_events((parts.demoter.report_degraded(conversation_id, "capture", exc),))


def put(parts: Parts, chat_store: BaseChatStore, cid: str, message: ChatMessage) -> None:
    """``put`` of a checked ``message``: :func:`store` it, at once when nothing captures."""
    if parts.capture is None:  # nothing else to do: store it
        chat_store.add_message(cid, message)
    else:
        store(parts, chat_store, cid, [message])


def store(parts: Parts, chat_store: BaseChatStore, cid: str, messages: list[ChatMessage]) -> None:
    """``put_messages`` of checked ``messages``: append them, then capture."""
    base = len(chat_store.get_messages(cid)) if needs_index(parts, messages) else 0
    for message in messages:
        chat_store.add_message(cid, message)
    if parts.capture is not None:
        capture_users(parts, cid, base, messages)


async def astore(
    parts: Parts, chat_store: BaseChatStore, cid: str, messages: list[ChatMessage]
) -> None:
    """Async :func:`store`: awaits the chat store."""
    needs = needs_index(parts, messages)
    base = len(await chat_store.aget_messages(cid)) if needs else 0
    for message in messages:
        await chat_store.async_add_message(cid, message)
    capture_users(parts, cid, base, messages)
