"""Loading a ``DemotingMemory``'s window: its history through the demoter, once per read.

A read (``get``/``aget``) loads the chat store's history of ``chat_store_key`` through
:meth:`demote.Demoter.load` (the async read awaits the chat store and
:meth:`~demote.Demoter.aload`), which plans the window, hands what fell out of it to the
hook once and commits; the load's events go to the instrumentation. In a token window the
caller's prefix and the recall's and the memory blocks' budgets are left free
(:func:`reserved_tokens`). Inside a :class:`~llamaindex_demote.DemotingLLM` run the memory
loads what the run's newest LLM call loaded, as it loaded it, and shows its stored part
(:mod:`llamaindex_demote._conversations`).

Sync and async share everything but the awaited calls: the async methods await the chat
store's async methods, :meth:`~demote.Demoter.aload` and the recall's ``asearch`` (or run
its ``search`` in a thread). LlamaIndex agents only call the async methods.
"""

from __future__ import annotations

from typing import Protocol

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.storage.chat_store import BaseChatStore

from demote.engine import Window
from demote.kit import count
from demote.window.tokens import MESSAGE_OVERHEAD
from llamaindex_demote import _conversations as reads
from llamaindex_demote._rendering import Parts
from llamaindex_demote.instrumentation import emit_events

__all__ = ["StoredMemory", "aload", "check_initial", "load", "reserved_tokens"]


class StoredMemory(Protocol):
    """Where a memory keeps its history (``DemotingMemory`` is one)."""

    chat_store: BaseChatStore
    chat_store_key: str


def check_initial(initial_token_count: int) -> None:
    """Refuse an ``initial_token_count`` that is not an int >= 0 (the message names it)."""
    count("initial_token_count", initial_token_count, minimum=0)


def reserved_tokens(parts: Parts, initial_token_count: int) -> int:
    """Tokens the window leaves free: the caller's prefix and the recall's budget.

    Only a token window counts them. The prefix is counted as one more message (its
    text's tokens, which the caller gives, and a message's framing).

    Raises:
        ConfigError: ``initial_token_count`` is not an int >= 0 (the message names it).
    """
    if initial_token_count.__class__ is not int or initial_token_count:
        check_initial(initial_token_count)  # (an int 0, the usual, is valid)
    if parts.demoter.policy.unit != "tokens":
        return 0
    prefix = initial_token_count + MESSAGE_OVERHEAD if initial_token_count else 0
    return prefix + parts.reserve()


def load(memory: StoredMemory, parts: Parts, reserved: int = 0) -> Window[ChatMessage]:
    """The window of ``memory``'s conversation, loaded through its demoter."""
    cid = memory.chat_store_key
    messages = memory.chat_store.get_messages(cid)
    run = None
    if reads.RUNS:  # (only a DemotingLLM records runs: a chat engine's memory has none)
        run = reads.run_history(parts.demoter, cid, messages, parts.describe)
    if run is None:
        window = parts.demoter.load(cid, messages, parts.describe, reserved=reserved)
    else:  # inside a DemotingLLM run: read what its newest LLM call read, as it read it
        history, describe, reserved = run
        loaded = parts.demoter.load(cid, history, describe, reserved=reserved)
        window = reads.stored_part(loaded, len(messages))
    if window.events:
        emit_events(window.events)
    return window


async def aload(memory: StoredMemory, parts: Parts, reserved: int = 0) -> Window[ChatMessage]:
    """Async :func:`load`: awaits the chat store and the demoter."""
    cid = memory.chat_store_key
    messages = await memory.chat_store.aget_messages(cid)
    run = None
    if reads.RUNS:
        run = reads.run_history(parts.demoter, cid, messages, parts.describe)
    if run is None:
        window = await parts.demoter.aload(cid, messages, parts.describe, reserved=reserved)
    else:  # inside a DemotingLLM run: read what its newest LLM call read, as it read it
        history, describe, reserved = run
        loaded = await parts.demoter.aload(cid, history, describe, reserved=reserved)
        window = reads.stored_part(loaded, len(messages))
    if window.events:
        emit_events(window.events)
    return window
