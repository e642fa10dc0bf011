"""Pure conversion: LangChain messages to core records and windows back to messages."""

from __future__ import annotations

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    HumanMessageChunk,
    SystemMessage,
    ToolMessage,
)

from demote import Demoter, SlidingWindow, Window
from demote.engine import render_summary
from demote.window.planner import turn_groups
from langchain_demote.messages import from_core, message_role, message_text, to_core

DEMOTER = Demoter(SlidingWindow.last_messages(10))


@pytest.mark.parametrize(
    ("message", "role"),
    [
        (HumanMessage("hi"), "user"),
        (HumanMessageChunk(content="hi"), "user"),
        (AIMessage("hello"), "assistant"),
        (AIMessageChunk(content="hel"), "assistant"),
        (SystemMessage("be brief"), "system"),
        (ToolMessage("42", tool_call_id="c1"), "tool"),
        (FunctionMessage(content="42", name="f"), "tool"),
        (ChatMessage(content="x", role="user"), "user"),
        (ChatMessage(content="x", role="Assistant"), "assistant"),
        (ChatMessage(content="x", role="developer"), "system"),
        (ChatMessage(content="x", role="critic"), "assistant"),
    ],
)
def test_roles(message: BaseMessage, role: str) -> None:
    assert message_role(message) == role
    assert to_core(message, DEMOTER.describe).role == role


def test_text_of_content_blocks_joins_text_blocks_only() -> None:
    message = HumanMessage(
        content=[
            {"type": "text", "text": "look at"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
            "this",
            {"type": "text", "text": "please"},
        ]
    )
    assert message_text(message) == "look at\nthis\nplease"
    assert to_core(message, DEMOTER.describe).text == "look at\nthis\nplease"


def test_tool_calls_open_and_tool_messages_answer() -> None:
    call = AIMessage(
        "",
        tool_calls=[
            {"name": "a", "args": {}, "id": "c1"},
            {"name": "b", "args": {}, "id": "c2"},
        ],
    )
    record = to_core(call, DEMOTER.describe)
    assert record.opens == ("c1", "c2") and record.answers is None
    answer = to_core(ToolMessage("ok", tool_call_id="c2"), DEMOTER.describe)
    assert answer.answers == "c2" and answer.opens == ()


def test_streamed_chunk_with_tool_call_chunks_opens_its_calls() -> None:
    chunk = AIMessageChunk(
        content="", tool_call_chunks=[{"name": "f", "args": "{}", "id": "c9", "index": 0}]
    )
    assert to_core(chunk, DEMOTER.describe).opens == ("c9",)


def test_tool_exchange_is_one_turn_group() -> None:
    messages = [
        HumanMessage("q1"),
        AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "c1"}]),
        ToolMessage("r1", tool_call_id="c1"),
        AIMessage("a1"),
        HumanMessage("q2"),
        AIMessageChunk(content="a2"),
    ]
    records = [to_core(m, DEMOTER.describe) for m in messages]
    assert turn_groups(records) == [0, 4]


def test_fingerprint_ignores_message_ids() -> None:
    one = to_core(HumanMessage("same", id="a"), DEMOTER.describe)
    two = to_core(HumanMessage("same", id="b"), DEMOTER.describe)
    assert one == two


def test_from_core_places_summary_after_pinned() -> None:
    pinned: list[BaseMessage] = [SystemMessage("rules")]
    kept: list[BaseMessage] = [HumanMessage("q"), AIMessage("a")]
    window = Window("c", pinned, "we talked", kept, start=5, total=7)
    out = from_core(window)
    assert out == [SystemMessage("rules"), SystemMessage(render_summary("we talked")), *kept]
    assert from_core(Window("c", pinned, None, kept, 5, 7)) == [*pinned, *kept]
