"""Section 1's setups: each prepares a memory over a history and returns one timed turn.

:data:`SETUPS` maps a setup's name to its ``prepare(history) -> turn(i)`` and the largest
history it is run at; :func:`floor` is the plain list every setup is compared with. The
setups are described in :mod:`bench.turn_cost`, the section that times them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from bench.common import approx_tokens, close_llama_memory

BUDGET = 4000

Pairs = list[tuple[str, str]]
# prepare(history) -> turn(i): one timed turn that stores message i and reads the window.
Prepare = Callable[[Pairs], Callable[[int], object]]


def floor(history: Pairs) -> Callable[[int], object]:
    texts = [t for _, t in history]
    counts = [approx_tokens(t) + 3 for t in texts]

    def turn(i: int) -> object:
        text = f"new message {i} " + texts[i % len(texts)]
        texts.append(text)
        counts.append(approx_tokens(text) + 3)
        used, start = 0, len(texts)
        while start > 0 and used + counts[start - 1] <= BUDGET:
            start -= 1
            used += counts[start]
        return texts[start:]

    return turn


def _lc(history: Pairs) -> Any:
    from langchain_core.chat_history import InMemoryChatMessageHistory
    from langchain_core.messages import AIMessage, HumanMessage

    kinds = {"user": HumanMessage, "assistant": AIMessage}
    return InMemoryChatMessageHistory(messages=[kinds[r](t) for r, t in history]), HumanMessage


def bare_history(history: Pairs) -> Callable[[int], object]:
    store, human = _lc(history)

    def turn(i: int) -> object:
        store.add_message(human(f"new message {i} " + history[i % len(history)][1]))
        return store.messages

    return turn


def trim(history: Pairs) -> Callable[[int], object]:
    from langchain_core.messages.utils import count_tokens_approximately, trim_messages

    store, human = _lc(history)

    def turn(i: int) -> object:
        store.add_message(human(f"new message {i} " + history[i % len(history)][1]))
        return trim_messages(
            store.messages,
            strategy="last",
            token_counter=count_tokens_approximately,
            max_tokens=BUDGET,
        )

    return turn


def _chat_messages(history: Pairs) -> list[Any]:
    from llama_index.core.llms import ChatMessage

    return [ChatMessage(role=r, content=t) for r, t in history]


def llama_memory(history: Pairs) -> Callable[[int], object]:
    from llama_index.core.async_utils import asyncio_run
    from llama_index.core.llms import ChatMessage
    from llama_index.core.memory import Memory
    from llama_index.core.storage.chat_store.base_db import MessageStatus

    memory = Memory.from_defaults(
        token_limit=BUDGET, tokenizer_fn=lambda text: [0] * approx_tokens(text)
    )
    messages = _chat_messages(history)
    # The steady state of a long chat: all but the newest ~budget already archived.
    keep, used = len(messages), 0
    while keep > 0 and used + approx_tokens(history[keep - 1][1]) <= BUDGET * 0.7:
        keep -= 1
        used += approx_tokens(history[keep][1])
    for lo in range(0, keep, 2000):  # SQLite caps the variables of one statement
        asyncio_run(
            memory.sql_store.add_messages(
                memory.session_id,
                messages[lo : min(keep, lo + 2000)],
                status=MessageStatus.ARCHIVED,
            )
        )
    memory.put_messages(messages[keep:])

    def turn(i: int) -> object:
        memory.put(
            ChatMessage(role="user", content=f"new message {i} " + history[i % len(history)][1])
        )
        return memory.get()

    turn.close = lambda: close_llama_memory(memory)  # type: ignore[attr-defined]
    return turn


def llama_buffer(history: Pairs) -> Callable[[int], object]:
    from llama_index.core.llms import ChatMessage
    from llama_index.core.memory import ChatMemoryBuffer

    memory = ChatMemoryBuffer.from_defaults(
        token_limit=BUDGET,
        chat_history=_chat_messages(history),
        tokenizer_fn=lambda text: [0] * approx_tokens(text),
    )

    def turn(i: int) -> object:
        memory.put(
            ChatMessage(role="user", content=f"new message {i} " + history[i % len(history)][1])
        )
        return memory.get()

    return turn


def demote_core(history: Pairs) -> Callable[[int], object]:
    from demote import Demoter, SlidingWindow
    from demote.records import MessageRecord

    demoter = Demoter(SlidingWindow.last_tokens(BUDGET))
    records = [demoter.describe(r, t) for r, t in history]

    def same(record: MessageRecord) -> MessageRecord:
        return record

    demoter.load("bench", records, same)  # the history so far is already planned

    def turn(i: int) -> object:
        records.append(demoter.describe("user", f"new message {i} " + history[i % len(history)][1]))
        return demoter.load("bench", records, same)

    return turn


# -- adapter slots -------------------------------------------------------------------------
# DemotingChatMessageHistory (langchain_demote) and DemotingMemory (llamaindex_demote) are
# written by another helper; these two setups run when their packages import, and are
# reported as skipped (with the reason) otherwise.


def _observed(demoter: Any) -> None:
    """Attach an observer that only counts (the events' cost once someone listens)."""
    seen = [0]

    def count(event: object) -> None:
        seen[0] += 1

    demoter.observe(count)


def _policy(sliding: bool) -> Any:
    from demote import PerItem, SlidingWindow

    if sliding:
        return SlidingWindow.last_tokens(BUDGET, eviction=PerItem())
    return SlidingWindow.last_tokens(BUDGET)


def demoting_history(
    history: Pairs, observed: bool = False, sliding: bool = False
) -> Callable[[int], object]:
    from demote import Demoter
    from langchain_demote import DemotingChatMessageHistory

    inner, human = _lc(history)
    demoter = Demoter(_policy(sliding))
    if observed:
        _observed(demoter)
    memory = DemotingChatMessageHistory(inner=inner, demoter=demoter, conversation_id="bench")
    _ = memory.messages  # the history so far is already planned

    def turn(i: int) -> object:
        memory.add_message(human(f"new message {i} " + history[i % len(history)][1]))
        return memory.messages

    turn.close = demoter.close  # type: ignore[attr-defined]
    return turn


def demoting_memory(
    history: Pairs, observed: bool = False, sliding: bool = False
) -> Callable[[int], object]:
    from llama_index.core.llms import ChatMessage

    from demote import NoopHook
    from llamaindex_demote import DemotingMemory

    memory = DemotingMemory.from_defaults(
        chat_history=_chat_messages(history),
        policy=_policy(sliding),
        hook=NoopHook(),  # the engine alone
        chat_store_key="bench",
    )
    if observed:
        _observed(memory.demoter)
    memory.get()

    def turn(i: int) -> object:
        memory.put(
            ChatMessage(role="user", content=f"new message {i} " + history[i % len(history)][1])
        )
        return memory.get()

    turn.close = memory.demoter.close  # type: ignore[attr-defined]
    return turn


# Setup name -> (prepare, largest history it is run at, or None for all).
SETUPS: dict[str, tuple[Prepare, int | None]] = {
    "floor (list + cached counts)": (floor, None),
    "InMemoryChatMessageHistory (no window)": (bare_history, None),
    "trim_messages": (trim, None),
    "LlamaIndex Memory": (llama_memory, None),
    "LlamaIndex ChatMemoryBuffer": (llama_buffer, 999),
    "demote core (Demoter.load)": (demote_core, None),
    "DemotingChatMessageHistory": (demoting_history, None),
    "DemotingMemory": (demoting_memory, None),
    # The window that moves every turn (a commit and an event each), then the same with an
    # observer attached (events are made either way; this is their hand-off to the
    # observer thread, which then competes for the GIL).
    "DemotingChatMessageHistory, sliding": (partial(demoting_history, sliding=True), None),
    "DemotingMemory, sliding": (partial(demoting_memory, sliding=True), None),
    "DemotingChatMessageHistory, sliding + observer": (
        partial(demoting_history, observed=True, sliding=True),
        None,
    ),
    "DemotingMemory, sliding + observer": (
        partial(demoting_memory, observed=True, sliding=True),
        None,
    ),
}
FLOOR = "floor (list + cached counts)"
