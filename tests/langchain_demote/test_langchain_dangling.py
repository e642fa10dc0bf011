"""A call the conversation moved on from gets a stand-in result in what the model is sent."""

from __future__ import annotations

from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from demote import Demoter, SlidingWindow
from langchain_demote import DemotingChatMessageHistory
from langchain_demote.history import UNANSWERED, answer_dangling


def call(*ids: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"id": i, "name": "approve", "args": {}} for i in ids])


def test_an_abandoned_call_is_answered_and_the_store_is_not() -> None:
    inner = InMemoryChatMessageHistory()
    history = DemotingChatMessageHistory(inner, Demoter(SlidingWindow.last_tokens(4000)), "c")
    stored = [
        HumanMessage("delete the repo"),
        call("a", "b"),
        ToolMessage("ok", tool_call_id="a"),
        HumanMessage("never mind, do something else"),
    ]
    history.add_messages(stored)
    sent = history.messages
    assert [type(m).__name__ for m in sent] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "ToolMessage",
        "HumanMessage",
    ]
    stand_in = sent[3]
    assert isinstance(stand_in, ToolMessage)
    assert (stand_in.tool_call_id, stand_in.content, stand_in.status) == ("b", UNANSWERED, "error")
    assert inner.messages == stored  # only what the model is sent changes


def test_a_call_at_the_end_is_about_to_run_and_nothing_is_added() -> None:
    messages = [HumanMessage("go"), call("a")]
    assert answer_dangling(messages) is messages
    whole = [HumanMessage("go"), call("a"), ToolMessage("done", tool_call_id="a")]
    assert answer_dangling(whole) is whole


def test_stand_ins_name_their_tool_and_a_call_without_an_id_gets_one_too() -> None:
    searched = AIMessage(
        "",
        tool_calls=[
            {"id": "x", "name": "search", "args": {}},
            {"id": None, "name": "fetch", "args": {}},
        ],
    )
    asked = AIMessage("", tool_calls=[{"id": "y", "name": "ask", "args": {}}])
    messages = [
        HumanMessage("go"),
        searched,
        ToolMessage("r", tool_call_id="x"),
        asked,
        HumanMessage("next"),
    ]
    sent = answer_dangling(messages)
    assert sent[:3] == messages[:3] and sent[4] is asked and sent[-1] is messages[-1]
    stand_ins = [sent[3], sent[5]]
    assert [(m.tool_call_id, m.name, m.content) for m in stand_ins] == [
        ("", "fetch", UNANSWERED),
        ("y", "ask", UNANSWERED),
    ]
    plain = [HumanMessage("a"), AIMessage("b")]
    assert answer_dangling(plain) is plain, "nothing dangles: the list itself"
