"""End to end: LlamaIndex chat engines over DemotingMemory for 60+ turns, offline."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.chat_engine import CondensePlusContextChatEngine, SimpleChatEngine
from llama_index.core.llms import MockLLM
from llama_index.core.llms.mock import MockLLMWithChatMemoryOfLastCall
from llama_index.core.schema import NodeWithScore, QueryBundle

from demote import Bulk, Demoter, DemoteWarning, FanOutHook, SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from demote.window.planner import turn_groups
from llamaindex_demote import DemotingMemory
from tests.conformance.contract import RecordingHook
from tests.llamaindex_demote.support import to_pairs

TURNS = 64

POLICIES = {
    "messages-peritem": SlidingWindow.last_messages(8),
    "tokens-bulk": SlidingWindow.last_tokens(200, eviction=Bulk(overflow=100)),
}


def bound(policy: SlidingWindow) -> int:
    extra = policy.eviction.overflow if isinstance(policy.eviction, Bulk) else 0
    return policy.limit + extra


def window_size(demoter: Demoter, pairs: list[tuple[str, str]]) -> int:
    if demoter.policy.unit == "messages":
        return len(pairs)
    records = [demoter.describe(role, text) for role, text in pairs]
    if demoter.policy.unit == "turns":
        return len(turn_groups(records)) if records else 0
    return sum(r.tokens for r in records)


def check(memory: DemotingMemory, recorder: RecordingHook) -> int:
    """The window is within the policy and everything before it was delivered once."""
    demoter, cid = memory.demoter, memory.chat_store_key
    history = to_pairs(memory.get_all())
    window = to_pairs(memory.get())
    start = demoter.state_of(cid).window_start
    assert window == history[start:]
    assert window_size(demoter, window) <= bound(demoter.policy)
    delivered = [(m.role, m.text, m.index) for b in recorder.batches for m in b.messages]
    assert delivered == [(r, t, i) for i, (r, t) in enumerate(history[:start])]
    return start


def archived(archive: SQLiteArchive, cid: str) -> list[tuple[str, str]]:
    return [(r.role, r.text) for r in archive.messages(cid)]


class NoRetriever(BaseRetriever):
    """Retrieves nothing (CondensePlusContextChatEngine needs a retriever)."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return []


@pytest.fixture
def archive(tmp_path: Path) -> SQLiteArchive:
    return SQLiteArchive(tmp_path / "archive.db")


@pytest.mark.parametrize("policy_id", list(POLICIES))
@pytest.mark.parametrize("mode", ["chat", "achat", "stream_chat", "astream_chat"])
def test_simple_chat_engine(mode: str, policy_id: str, archive: SQLiteArchive) -> None:
    recorder = RecordingHook()
    demoter = Demoter(POLICIES[policy_id], FanOutHook(recorder, archive), on_hook_error="raise")
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="simple")
    llm = MockLLMWithChatMemoryOfLastCall(max_tokens=12)
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)

    async def turn_async(i: int) -> str:
        if mode == "achat":
            return (await engine.achat(f"question {i}")).response
        stream = await engine.astream_chat(f"question {i}")
        return "".join([t async for t in stream.async_response_gen()])

    start = 0
    for i in range(TURNS):
        if mode == "chat":
            reply = engine.chat(f"question {i}").response
        elif mode == "stream_chat":
            reply = "".join(engine.stream_chat(f"question {i}").response_gen)
        else:
            reply = asyncio.run(turn_async(i))
        assert reply
        # What the model saw is the window as it stood after the user's message.
        seen = to_pairs(llm.last_chat_messages or [])
        assert seen[-1] == ("user", f"question {i}")
        assert window_size(demoter, seen) <= bound(demoter.policy)
        new_start = check(memory, recorder)
        assert new_start >= start
        start = new_start
    assert start > TURNS  # most of the conversation was demoted
    history = to_pairs(memory.get_all())
    assert len(history) == 2 * TURNS
    assert archived(archive, "simple") == history[:start]


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_condense_plus_context_engine(flavour: str, archive: SQLiteArchive) -> None:
    recorder = RecordingHook()
    demoter = Demoter(SlidingWindow.last_turns(3), FanOutHook(recorder, archive))
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="cpc")
    engine = CondensePlusContextChatEngine.from_defaults(
        retriever=NoRetriever(), llm=MockLLM(max_tokens=8), memory=memory
    )
    for i in range(TURNS):
        if flavour == "sync":
            engine.chat(f"question {i}")
        else:
            asyncio.run(engine.achat(f"question {i}"))
        check(memory, recorder)
        assert len(memory.get()) <= 6  # 3 turn groups of user + assistant
    history = to_pairs(memory.get_all())
    assert len(history) == 2 * TURNS
    start = demoter.state_of("cpc").window_start
    assert start == 2 * TURNS - 6
    assert archived(archive, "cpc") == history[:start]


def test_chat_engine_passes_real_initial_token_count() -> None:
    counts: list[int] = []

    class Spy(DemotingMemory):
        def get(self, input: str | None = None, initial_token_count: int = 0, **kw: object):  # type: ignore[no-untyped-def]
            counts.append(initial_token_count)
            return super().get(input, initial_token_count)

    memory = Spy(demoter=Demoter(SlidingWindow.last_tokens(500)))
    engine = SimpleChatEngine.from_defaults(
        llm=MockLLM(max_tokens=4), memory=memory, system_prompt="x" * 400
    )
    engine.chat("hello")
    assert counts == [100]  # the system prompt, counted by the policy's counter


def test_engine_builds_the_memory_from_memory_cls() -> None:
    llm = MockLLM(max_tokens=3)
    with pytest.warns(DemoteWarning, match="no long tail"):  # (see test_llamaindex_defaults)
        engine = SimpleChatEngine.from_defaults(llm=llm, memory_cls=DemotingMemory)
    engine.chat("hi")
    assert len(engine.chat_history) == 2
    memory = engine._memory
    assert isinstance(memory, DemotingMemory)
    # SimpleChatEngine passes token_limit=context_window - 256.
    assert memory.demoter.policy == SlidingWindow.last_tokens(llm.metadata.context_window - 256)
