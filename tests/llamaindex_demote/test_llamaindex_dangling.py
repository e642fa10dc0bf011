"""A call the conversation moved on from gets a stand-in result in what the model is sent.

A real ``DemotingMemory`` over a ``SimpleChatStore`` holding an abandoned call (two
calls opened, one answered, then a new user message): what ``aget`` and ``get`` return
answers the other with a tool message LlamaIndex's LLM integrations read (its
``tool_call_id`` and tool ``name``), and the chat store is not changed.
"""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.storage.chat_store import SimpleChatStore

from demote import Demoter, SlidingWindow
from demote.window.pairing import UNANSWERED
from llamaindex_demote import DemotingMemory
from llamaindex_demote.messages import answered_call, opened_calls

pytestmark = pytest.mark.filterwarnings(
    "ignore::pydantic.warnings.PydanticDeprecationWarning:inspect"
)


def abandoned() -> list[ChatMessage]:
    calls = [ToolCallBlock(tool_call_id=c, tool_name="approve", tool_kwargs={}) for c in "ab"]
    return [
        ChatMessage(role=MessageRole.USER, content="delete the repo"),
        ChatMessage(role=MessageRole.ASSISTANT, blocks=calls),
        ChatMessage(
            role=MessageRole.TOOL,
            blocks=[TextBlock(text="ok")],
            additional_kwargs={"tool_call_id": "a"},
        ),
        ChatMessage(role=MessageRole.USER, content="never mind, do something else"),
    ]


def memory(store: SimpleChatStore) -> DemotingMemory:
    demoter = Demoter(SlidingWindow.last_tokens(4000))
    return DemotingMemory(demoter=demoter, chat_store=store, chat_store_key="c")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_abandoned_call_is_answered_and_the_store_is_not(mode: str) -> None:
    store = SimpleChatStore()
    stored = abandoned()
    store.set_messages("c", stored)
    mem = memory(store)
    sent = asyncio.run(mem.aget()) if mode == "async" else mem.get()
    assert [m.role for m in sent] == [
        MessageRole.USER,
        MessageRole.ASSISTANT,
        MessageRole.TOOL,
        MessageRole.TOOL,
        MessageRole.USER,
    ]
    stand_in = sent[3]
    assert answered_call(stand_in) == "b" and stand_in.content == UNANSWERED
    assert stand_in.additional_kwargs["name"] == "approve"
    answered = {answered_call(m) for m in sent} - {None}
    assert answered == set(opened_calls(sent[1])), "every call has its result"
    assert store.get_messages("c") == stored, "only what the model is sent changes"


def test_a_call_at_the_end_is_about_to_run_and_nothing_is_added() -> None:
    store = SimpleChatStore()
    store.set_messages("c", abandoned()[:2])
    sent = memory(store).get()
    assert [m.role for m in sent] == [MessageRole.USER, MessageRole.ASSISTANT]
