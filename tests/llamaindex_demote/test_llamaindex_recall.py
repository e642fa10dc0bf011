"""Recall: a fact stated early is demoted to the archive, then brought back for a question."""

from __future__ import annotations

from pathlib import Path

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms.mock import MockLLMWithChatMemoryOfLastCall

from demote import SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from llamaindex_demote import RECALL_PREFIX, DemotingMemory
from tests.llamaindex_demote.support import to_pairs, tool_calling_llm

FACT = "my locker code is 4512"
QUESTION = "what is my locker code?"
TOPICS = ("weather", "lunch", "trains", "music", "football", "gardening", "movies")


def filler(i: int) -> str:
    return f"tell me about {TOPICS[i % len(TOPICS)]} number {i}"


@pytest.fixture
def archive(tmp_path: Path) -> SQLiteArchive:
    return SQLiteArchive(tmp_path / "archive.db")


def recall_texts(messages: list[ChatMessage]) -> list[str]:
    return [m.content or "" for m in messages if (m.content or "").startswith(RECALL_PREFIX)]


def test_fact_is_demoted_then_recalled(archive: SQLiteArchive) -> None:
    memory = DemotingMemory.from_defaults(
        policy=SlidingWindow.last_turns(4),
        hook=archive,
        recall=archive,
        recall_k=3,
        chat_store_key="locker",
    )
    llm = MockLLMWithChatMemoryOfLastCall(max_tokens=6)
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    engine.chat(FACT)
    for i in range(30):
        engine.chat(filler(i))
    assert all(FACT not in (m.content or "") for m in memory.get(initial_token_count=0))
    assert ("user", FACT) in [(r.role, r.text) for r in archive.messages("locker")]

    # CondensePlusContext-style: get(input=...) before the question is stored.
    got = memory.get(input=QUESTION)
    assert recall_texts(got) == [recall_texts(got)[0]] and FACT in recall_texts(got)[0]
    assert got[-1].content == recall_texts(got)[0]  # at the end: the question follows

    # SimpleChatEngine-style: the question is stored first, get() has no input.
    engine.chat(QUESTION)
    sent = list(llm.last_chat_messages or [])
    assert sent[-2].content == QUESTION  # the recall right after the question
    assert FACT in (sent[-1].content or "") and sent[-1].content.startswith(RECALL_PREFIX)  # type: ignore[union-attr]
    assert sent[-1].role == "user" and all(m.role != "system" for m in sent[1:])
    assert sum(1 for m in sent if (m.content or "").startswith(RECALL_PREFIX)) == 1

    # Recalled text is never stored, demoted or archived again.
    for i in range(30, 45):
        engine.chat(filler(i))
    assert not recall_texts(memory.get_all())
    texts = [r.text for r in archive.messages("locker")]
    assert texts.count(FACT) == 1
    assert not any(t.startswith(RECALL_PREFIX) for t in texts)


# FunctionAgent construction warns from pydantic (see test_llamaindex_agent.py).
@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning:inspect")
async def test_async_recall_in_function_agent(archive: SQLiteArchive) -> None:
    memory = DemotingMemory.from_defaults(
        policy=SlidingWindow.last_messages(8), hook=archive, recall=archive, chat_store_key="fa"
    )
    await memory.aput_messages([ChatMessage(role="user", content=FACT)])
    await memory.aput_messages([ChatMessage(role="assistant", content="noted")])
    for i in range(10):
        await memory.aput(ChatMessage(role="user", content=filler(i)))
        await memory.aput(ChatMessage(role="assistant", content="ok"))
    await memory.aget()
    assert archive.count("fa") > 2

    seen: list[list[ChatMessage]] = []

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = FunctionAgent(tools=[add], llm=tool_calling_llm(seen))
    await agent.run(QUESTION, memory=memory)
    first = to_pairs(seen[0])
    assert first[-2] == ("user", QUESTION)
    assert first[-1][0] == "user" and FACT in first[-1][1]
