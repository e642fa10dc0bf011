"""Pure conversion: roles, text, tool-call ids where LlamaIndex 0.14 keeps them."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import (
    ChatMessage,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.llms.llm import ToolSelection

from demote import Demoter, Recalled, SlidingWindow
from demote.records import fingerprint, parts_digest
from llamaindex_demote import RECALL_PREFIX, from_core, to_core
from llamaindex_demote.messages import (
    answered_call,
    core_role,
    opened_calls,
    recall_message,
    text_of,
)

DEMOTER = Demoter(SlidingWindow.last_messages(10))


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        (MessageRole.SYSTEM, "system"),
        (MessageRole.DEVELOPER, "system"),
        (MessageRole.USER, "user"),
        (MessageRole.ASSISTANT, "assistant"),
        (MessageRole.CHATBOT, "assistant"),
        (MessageRole.MODEL, "assistant"),
        (MessageRole.TOOL, "tool"),
        (MessageRole.FUNCTION, "tool"),
    ],
)
def test_roles(role: MessageRole, expected: str) -> None:
    assert core_role(ChatMessage(role=role, content="x")) == expected


def test_text_is_text_blocks_only() -> None:
    message = ChatMessage(
        role="assistant",
        blocks=[
            ThinkingBlock(content="hmm"),
            TextBlock(text="one"),
            ImageBlock(url="http://example.invalid/a.png"),
            TextBlock(text="two"),
            ToolCallBlock(tool_call_id="c1", tool_name="f"),
        ],
    )
    assert text_of(message) == "one\ntwo"
    assert text_of(ChatMessage(role="assistant", blocks=[])) == ""


def test_tool_call_blocks_open_calls() -> None:
    message = ChatMessage(
        role="assistant",
        blocks=[
            ToolCallBlock(tool_call_id="a", tool_name="f"),
            ToolCallBlock(tool_call_id=None, tool_name="g"),  # no id: nothing to pair
            ToolCallBlock(tool_call_id="b", tool_name="f"),
        ],
    )
    assert opened_calls(message) == ("a", "b")


def test_legacy_additional_kwargs_tool_calls() -> None:
    class OpenAIStyle:
        def __init__(self, id: str) -> None:
            self.id = id

    message = ChatMessage(
        role="assistant",
        content="",
        additional_kwargs={
            "tool_calls": [
                {"id": "d1", "type": "function"},
                OpenAIStyle("o1"),
                ToolSelection(tool_id="s1", tool_name="f", tool_kwargs={}),
                {"type": "function"},  # no id
            ]
        },
    )
    assert opened_calls(message) == ("d1", "o1", "s1")
    # Both places at once: each id once, blocks first.
    both = ChatMessage(
        role="assistant",
        blocks=[ToolCallBlock(tool_call_id="d1", tool_name="f")],
        additional_kwargs={"tool_calls": [{"id": "d1"}, {"id": "d2"}]},
    )
    assert opened_calls(both) == ("d1", "d2")


def test_tool_message_answers_its_call() -> None:
    tool = ChatMessage(role="tool", content="42", additional_kwargs={"tool_call_id": "c7"})
    assert answered_call(tool) == "c7"
    # Only tool messages answer; FunctionAgent's return_direct assistant copy does not.
    direct = ChatMessage(role="assistant", content="42", additional_kwargs={"tool_call_id": "c7"})
    assert answered_call(direct) is None
    assert answered_call(ChatMessage(role="tool", content="42")) is None


def test_to_core_record() -> None:
    call = ChatMessage(
        role="assistant",
        blocks=[TextBlock(text="let me look"), ToolCallBlock(tool_call_id="c1", tool_name="f")],
    )
    rec = to_core(call, DEMOTER.describe)
    assert (rec.role, rec.text, rec.opens, rec.answers) == (
        "assistant",
        "let me look",
        ("c1",),
        None,
    )
    # The call's name and arguments are part of the fingerprint (edited arguments recount).
    calls = [{"id": "c1", "name": "f", "args": {}}]
    assert rec.fingerprint == fingerprint(
        "assistant", "let me look", ("c1",), None, parts_digest(calls)
    )
    result = to_core(
        ChatMessage(role="tool", content="ok", additional_kwargs={"tool_call_id": "c1"}),
        DEMOTER.describe,
    )
    assert (result.role, result.answers) == ("tool", "c1")


def test_fingerprint_ignores_tool_kwargs_serialization() -> None:
    a = ChatMessage(
        role="assistant",
        blocks=[ToolCallBlock(tool_call_id="c", tool_name="f", tool_kwargs={"x": 1})],
    )
    b = ChatMessage(
        role="assistant",
        blocks=[ToolCallBlock(tool_call_id="c", tool_name="f", tool_kwargs='{"x": 1}')],
    )
    assert to_core(a, DEMOTER.describe) == to_core(b, DEMOTER.describe)
    edited = ChatMessage(
        role="assistant",
        blocks=[ToolCallBlock(tool_call_id="c", tool_name="f", tool_kwargs={"x": 2})],
    )
    assert to_core(edited, DEMOTER.describe).fingerprint != to_core(a, DEMOTER.describe).fingerprint


def test_from_core() -> None:
    message = from_core("system", "be brief")
    assert message.role == MessageRole.SYSTEM and message.content == "be brief"


def test_recall_message_is_one_user_message_oldest_first() -> None:
    hits = [
        Recalled("assistant", "noted: 4512", 7, "k7", 2.0),
        Recalled("user", "from elsewhere", -1, "kx", 9.0),
        Recalled("user", "my locker code is 4512", 6, "k6", 1.0),
    ]
    message = recall_message(hits)
    assert message.role == MessageRole.USER
    assert message.content == RECALL_PREFIX + (
        "- user: my locker code is 4512\n- assistant: noted: 4512\n- user: from elsewhere"
    )
    assert recall_message(hits, "system").role == MessageRole.SYSTEM
