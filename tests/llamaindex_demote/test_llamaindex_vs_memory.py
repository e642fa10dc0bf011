"""Side by side with LlamaIndex's own ``Memory.from_defaults(token_limit=...)``.

The same conversation goes into both; the assertions record what we observed with
llama-index-core 0.14.25 (see the LlamaIndex getting-started page on the differences):

- ``Memory`` keeps ``0.7 * token_limit`` tokens of chat history and, when over, flushes
  at least ``token_flush_size`` tokens at once. The default flush size (3000) is clipped to
  ``0.7 * token_limit`` when the limit is below 3000, so a flush empties the whole history
  budget and the model can be left with the new question alone. ``DemotingMemory`` trims
  one turn group at a time (``PerItem``), or cuts back to the limit (``Bulk``).
- ``Memory`` trims on ``put``; ``DemotingMemory`` on ``get``.
- ``Memory`` runs its memory blocks inline: every ``get`` awaits each block's ``_aget`` and
  inserts the result at the head of the prompt; every flush awaits each block's ``_aput``.
  ``DemotingMemory`` puts recall right before the newest user message, so the head of the
  prompt does not change between calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.memory import Memory
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.utils import get_tokenizer
from pydantic import Field
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from demote import Bulk, NoopHook, PerItem, Recalled, SlidingWindow
from llamaindex_demote import DemotingMemory
from tests.conformance.contract import RecordingHook


def tiktoken_count() -> Callable[[str], int]:
    tokenizer = get_tokenizer()  # LlamaIndex's bundled cl100k encoding: offline

    def count(text: str) -> int:
        return len(tokenizer(text))

    return count


def turn(i: int, words: int) -> tuple[ChatMessage, ChatMessage]:
    return (
        ChatMessage(role="user", content=f"q{i} " + "word " * words),
        ChatMessage(role="assistant", content=f"a{i} " + "word " * words),
    )


async def drive(memories: list[Any], turns: int, words: int) -> list[list[list[ChatMessage]]]:
    """Put each turn into every memory; record what aget() returns after the user message.

    Async only: LlamaIndex agents use these, and ``Memory``'s sync wrappers run each call
    on a new event loop, leaving aiosqlite connections to be garbage collected unclosed
    (a ``ResourceWarning``).
    """
    seen: list[list[list[ChatMessage]]] = [[] for _ in memories]
    for i in range(turns):
        user, assistant = turn(i, words)
        for memory, log in zip(memories, seen, strict=True):
            await memory.aput(user)
            log.append(await memory.aget())
            await memory.aput(assistant)
    return seen


@pytest.fixture
async def engine() -> AsyncIterator[AsyncEngine]:
    """The SQL engine behind ``Memory``'s chat store, disposed after the test."""
    engine = create_async_engine("sqlite+aiosqlite:///:memory:")
    yield engine
    await engine.dispose()


class ChunkBlock(BaseMemoryBlock[str]):
    """A memory block that records each flushed chunk and counts its reads."""

    chunks: list[list[ChatMessage]] = Field(default_factory=list)
    reads: int = 0

    async def _aget(self, messages: list[ChatMessage] | None = None, **kw: Any) -> str:
        self.reads += 1
        return f"block read {self.reads}"

    async def _aput(self, messages: list[ChatMessage]) -> None:
        self.chunks.append(list(messages))


async def test_small_limit_collapses_theirs_not_ours(engine: AsyncEngine) -> None:
    count = tiktoken_count()
    theirs = Memory.from_defaults(session_id="s", token_limit=500, async_engine=engine)
    hook = RecordingHook()
    ours = DemotingMemory.from_defaults(
        policy=SlidingWindow.last_tokens(350, counter=count, eviction=PerItem()),
        hook=hook,
        chat_store_key="s",
    )
    assert theirs.token_flush_size == 350  # 3000 clipped to 0.7 * 500: the whole budget
    seen_theirs, seen_ours = await drive([theirs, ours], 60, 30)
    theirs_sizes = [len(g) for g in seen_theirs]
    ours_sizes = [len(g) for g in seen_ours]
    # Theirs: a sawtooth that falls to the new question alone every few turns.
    assert theirs_sizes[:10] == [1, 3, 5, 7, 9, 1, 3, 5, 7, 9]
    assert theirs_sizes.count(1) == 12
    # Ours: after warm-up, the same number of messages every turn (whole groups that fit).
    assert ours_sizes[:5] == [1, 3, 5, 7, 9] and set(ours_sizes[5:]) == {9}
    # Both keep the full history; ours handed everything before its window to the hook.
    assert len(await theirs.aget_all()) == len(await ours.aget_all()) == 120
    start = ours.demoter.state_of("s").window_start
    assert [m.index for b in hook.batches for m in b.messages] == list(range(start))


async def test_default_flush_is_3000_token_chunks_inline_in_put(engine: AsyncEngine) -> None:
    count = tiktoken_count()
    block = ChunkBlock(name="chunks")
    theirs = Memory.from_defaults(session_id="d", memory_blocks=[block], async_engine=engine)
    assert (theirs.token_limit, theirs.token_flush_size) == (30000, 3000)
    ours = DemotingMemory.from_defaults(
        hook=NoopHook(),
        policy=SlidingWindow.last_tokens(18000, counter=count, eviction=Bulk(overflow=3000)),
        chat_store_key="d",
    )
    per_message = count(turn(0, 200)[0].content or "")
    seen_theirs, seen_ours = await drive([theirs, ours], 60, 200)
    # Flushes happen during a put, each of at least 3000 tokens, rounded up to a turn.
    assert len(block.chunks) == 2
    for chunk in block.chunks:
        assert chunk[0].role == "user" and chunk[-1].role == "assistant"
        assert 3000 <= sum(count(m.content or "") for m in chunk) < 3000 + 2 * per_message
    # Every get() read the block once, and put the result at the head of the prompt.
    assert block.reads == 60
    heads = [g[0].content for g in seen_theirs]
    assert heads[0] != heads[1]  # the prompt prefix changes on every call
    # Ours with Bulk(overflow=3000) on 18000 tokens gives a similar sawtooth, via the hook.
    sizes = [len(g) for g in seen_ours]
    assert max(sizes) > min(sizes[30:]) and ours.demoter.state_of("d").window_start > 0


async def test_recall_keeps_the_prompt_head_stable() -> None:
    class Fixed:
        def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
            return [Recalled("user", f"old note for {query}", -1, "k")]

    ours = DemotingMemory.from_defaults(
        hook=NoopHook(), policy=SlidingWindow.last_messages(50), recall=Fixed(), chat_store_key="h"
    )
    await ours.aput(ChatMessage(role="system", content="you are terse"))
    (seen,) = await drive([ours], 6, 3)
    assert {g[0].content for g in seen} == {"you are terse"}
    # Right after the question, as a user message: the head never changes.
    assert all(g[-1].content and "old note" in g[-1].content for g in seen[1:])
    assert all(g[-1].role == "user" and g[-2].role == "user" for g in seen[1:])
