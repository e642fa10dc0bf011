"""Every LlamaIndex chat engine, in its four call styles, cannot tell DemotingMemory apart.

``llama_index.core.chat_engine`` exports six engines; each is documented with ``chat``,
``achat``, ``stream_chat`` and ``astream_chat`` and a ``memory=`` it reads (``get`` with
``input`` and ``initial_token_count``) and writes (``put``). Each engine runs the same
conversation twice, over LlamaIndex's ``ChatMemoryBuffer`` (large enough never to trim)
and over a ``DemotingMemory`` whose window never demotes: the model must be sent the same
messages, the replies must be the same, and so must the stored histories. A third run
with a small window checks the model is then sent a bounded window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from llama_index.core.chat_engine import (
    CondensePlusContextChatEngine,
    CondenseQuestionChatEngine,
    ContextChatEngine,
    MultiModalCondensePlusContextChatEngine,
    MultiModalContextChatEngine,
    SimpleChatEngine,
)
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.memory.types import BaseMemory

from demote import Demoter, SlidingWindow
from llamaindex_demote import DemotingMemory
from tests.conformance._llamaindex import EchoLLM, EchoQueryEngine, FixedRetriever, pairs
from tests.conformance.contract import RecordingHook

STYLES = ("chat", "achat", "stream_chat", "astream_chat")
TURNS = 5
NEVER = SlidingWindow.last_messages(10_000)


def simple(llm: EchoLLM, memory: BaseMemory, streaming: bool) -> Any:
    return SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt="be terse")


def context(llm: EchoLLM, memory: BaseMemory, streaming: bool) -> Any:
    return ContextChatEngine.from_defaults(retriever=FixedRetriever(), llm=llm, memory=memory)


def condense_question(llm: EchoLLM, memory: BaseMemory, streaming: bool) -> Any:
    return CondenseQuestionChatEngine.from_defaults(
        query_engine=EchoQueryEngine(streaming=streaming), llm=llm, memory=memory
    )


def condense_plus_context(llm: EchoLLM, memory: BaseMemory, streaming: bool) -> Any:
    return CondensePlusContextChatEngine.from_defaults(
        retriever=FixedRetriever(), llm=llm, memory=memory
    )


def multi_modal_context(llm: EchoLLM, memory: BaseMemory, streaming: bool) -> Any:
    return MultiModalContextChatEngine.from_defaults(
        retriever=FixedRetriever(), multi_modal_llm=llm, memory=memory
    )


def multi_modal_condense_plus_context(llm: EchoLLM, memory: BaseMemory, streaming: bool) -> Any:
    return MultiModalCondensePlusContextChatEngine(
        retriever=FixedRetriever(), multi_modal_llm=llm, memory=memory
    )


ENGINES: dict[str, Callable[[EchoLLM, BaseMemory, bool], Any]] = {
    "simple": simple,
    "context": context,
    "condense_question": condense_question,
    "condense_plus_context": condense_plus_context,
    "multi_modal_context": multi_modal_context,
    "multi_modal_condense_plus_context": multi_modal_condense_plus_context,
}


async def ask(engine: Any, style: str, text: str) -> str:
    if style == "chat":
        return str(engine.chat(text).response)
    if style == "achat":
        return str((await engine.achat(text)).response)
    if style == "stream_chat":
        response = engine.stream_chat(text)
        return "".join(response.response_gen)
    response = await engine.astream_chat(text)
    return "".join([token async for token in response.async_response_gen()])


def converse(name: str, style: str, memory: BaseMemory) -> tuple[Any, ...]:
    llm = EchoLLM()
    engine = ENGINES[name](llm, memory, style.endswith("stream_chat"))
    replies = [asyncio.run(ask(engine, style, f"question {i}")) for i in range(TURNS)]
    return replies, llm.chats, llm.prompts, pairs(memory.get_all())


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("name", list(ENGINES))
def test_never_demoting_window_is_invisible(name: str, style: str) -> None:
    buffer = ChatMemoryBuffer.from_defaults(token_limit=1_000_000, tokenizer_fn=str.split)
    hook = RecordingHook()
    ours = DemotingMemory.from_defaults(demoter=Demoter(NEVER, hook))
    expected = converse(name, style, buffer)
    replies, chats, _, history = expected
    assert len(history) == 2 * TURNS and history[-2] == ("user", "question 4")
    assert all(reply for reply in replies) and chats
    assert converse(name, style, ours) == expected
    assert hook.batches == []


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("name", list(ENGINES))
def test_small_window_bounds_what_the_model_is_sent(name: str, style: str) -> None:
    hook = RecordingHook()
    memory = DemotingMemory.from_defaults(demoter=Demoter(SlidingWindow.last_turns(2), hook))
    _, chats, _, history = converse(name, style, memory)
    assert len(history) == 2 * TURNS
    for sent in chats:
        assert sum(role == "user" for role, _ in sent) <= 3  # two kept turns and the question
    start = memory.demoter.state_of(memory.chat_store_key).window_start
    # Engines that store the question before reading see it in the window, others do not.
    assert start in (2 * TURNS - 4, 2 * TURNS - 6)
    assert [(m.role, m.text) for b in hook.batches for m in b.messages] == history[:start]
