"""Compaction end to end in a LlamaIndex chat engine, MockLLM as the summarizer (issue 9)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM
from pydantic import PrivateAttr

from demote import Compact, Demoter, Demotion, SlidingWindow
from demote.engine import SUMMARY_PREFIX
from llamaindex_demote import DemotingMemory
from llamaindex_demote.summarizer import LLMSummarizer

LIMIT, K = 8, 4


class RecordingLLM(MockLLM):
    """MockLLM that records the messages each chat call receives."""

    _seen: list[list[ChatMessage]] = PrivateAttr(default_factory=list)

    @property
    def seen(self) -> list[list[ChatMessage]]:
        return self._seen

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        self._seen.append(list(messages))
        return super().chat(messages, **kwargs)


class SlowMockLLM(MockLLM):
    """MockLLM (echoes its prompt) that takes its time: a slow summarizer."""

    _delay: float = PrivateAttr(default=0.0)

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        time.sleep(self._delay)
        return super().chat(messages, **kwargs)

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        # MockLLM's own achat calls chat (blocking); a real async client awaits its I/O.
        await asyncio.sleep(self._delay)
        return MockLLM.chat(self, messages, **kwargs)


class Archive:
    def __init__(self) -> None:
        self.keys: list[str] = []

    def deliver(self, batch: Demotion) -> None:
        self.keys.extend(m.key for m in batch.messages)


def build(delay: float) -> tuple[SimpleChatEngine, RecordingLLM, Demoter, Archive]:
    archive = Archive()
    slow = SlowMockLLM()
    slow._delay = delay
    demoter = Demoter(
        SlidingWindow.last_messages(LIMIT, eviction=Compact(compact_count=K)),
        archive,
        summarizer=LLMSummarizer(slow, max_summary_tokens=300),
    )
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="u1")
    llm = RecordingLLM(max_tokens=8)
    engine = SimpleChatEngine.from_defaults(
        llm=llm,
        memory=memory,
        prefix_messages=[ChatMessage(role=MessageRole.SYSTEM, content="be brief")],
    )
    return engine, llm, demoter, archive


def test_chat_engine_sends_the_summary_in_place() -> None:
    engine, llm, demoter, archive = build(delay=0.0)
    for i in range(40):
        engine.chat(f"fact number {i}")
        assert demoter.drain(5)
    with_summary = [
        sent for sent in llm.seen if any(SUMMARY_PREFIX in str(m.content) for m in sent)
    ]
    assert with_summary
    for sent in llm.seen:
        summaries = [m for m in sent if SUMMARY_PREFIX in str(m.content)]
        assert len(summaries) <= 1
        if summaries:  # right after the system prefix, before any history, as a user
            # message: the system block (the engine's prefix) is never changed
            assert sent.index(summaries[0]) == 1
            assert summaries[0].role == MessageRole.USER
        assert all(m.role != MessageRole.SYSTEM for m in sent[1:])
        history = [m for m in sent[1:] if SUMMARY_PREFIX not in str(m.content)]
        assert len(history) <= LIMIT + 2 * K
    summary = demoter.state_of("u1").summary
    assert summary is not None and len(summary) // 4 <= 300  # bounded by max_summary_tokens
    state = demoter.state_of("u1")
    assert len(archive.keys) == len(set(archive.keys)) == state.delivered


async def test_async_chat_with_slow_summarizer_does_not_wait() -> None:
    engine, _, demoter, _ = build(delay=1.5)
    durations = []
    for i in range(8):  # compaction starts at turn 6; turn 7 stays under the bulk fallback
        t0 = time.perf_counter()
        await engine.achat(f"fact number {i}")
        durations.append(time.perf_counter() - t0)
    assert max(durations) < 1.0, durations  # loose: nobody waited for the 1.5 s summary
    assert await demoter.adrain(10)
    assert demoter.state_of("u1").summary is not None
