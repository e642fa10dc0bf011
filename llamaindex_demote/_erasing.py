"""Erasing a memory's conversation: its chat store key, its demotion state, its long tail.

``DemotingMemory.erase`` runs :func:`demote.engine.erase_conversation` with the
chat store as the inner store: the messages of ``chat_store_key`` are read (at their
positions, which their dedup keys hold), deleted from the chat store unless the caller
keeps them, then the engine erases the state and every tier behind the hook, and the
memory's ``capture`` after them.
"""

from __future__ import annotations

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.storage.chat_store import BaseChatStore

from demote.engine import erase_conversation
from demote.erase import EraseReport
from demote.flow import Call, Flow, Twin
from llamaindex_demote._rendering import Parts

__all__ = ["erase_chat"]


def erase_chat(
    parts: Parts, chat_store: BaseChatStore, conversation_id: str, inner: bool, wait: float | None
) -> Flow[EraseReport]:
    """The erase flow of one conversation (see the module docstring).

    Args:
        parts: The memory's demoter, describe and capture.
        chat_store: Where the memory keeps the full history.
        conversation_id: The memory's ``chat_store_key``.
        inner: Also delete the messages from the chat store.
        wait: Passed to :meth:`demote.Demoter.erase`.
    """

    def held() -> list[tuple[int, ChatMessage]]:
        return list(enumerate(chat_store.get_messages(conversation_id)))

    async def aheld() -> list[tuple[int, ChatMessage]]:
        return list(enumerate(await chat_store.aget_messages(conversation_id)))

    return erase_conversation(
        parts.demoter,
        conversation_id,
        parts.describe,
        read=Twin(held, aheld),
        clear=Call(chat_store, "delete_messages", (conversation_id,), {}) if inner else None,
        inner=(chat_store, "chat store"),
        also=() if parts.capture is None else (parts.capture,),
        wait=wait,
    )
