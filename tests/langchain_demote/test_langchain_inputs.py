"""What the LangChain history refuses: anything that is not a message, before storing it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage

from demote import DemoteError, Demoter, MessageTypeError, SlidingWindow
from langchain_demote import DemotingChatMessageHistory
from tests.conformance.contract import RecordingHook

BAD_LISTS: dict[str, tuple[Any, str]] = {
    "str": ("hello", r"messages: expected a list of BaseMessage, got str"),
    "bytes": (b"hello", r"messages: expected a list of BaseMessage, got bytes"),
    "none": (None, r"messages: expected a list of BaseMessage, got NoneType"),
    "message": (HumanMessage("hi"), r"messages: expected a list of BaseMessage, got HumanMessage"),
    "dict": ({"role": "user", "content": "hi"}, r"messages: expected a list of BaseMessage"),
    "none-item": (
        [HumanMessage("ok"), None],
        r"messages\[1\]: expected a BaseMessage, got NoneType",
    ),
    "str-item": (["hello"], r"messages\[0\]: expected a BaseMessage, got str"),
}


def history() -> tuple[DemotingChatMessageHistory, InMemoryChatMessageHistory, RecordingHook]:
    inner, hook = InMemoryChatMessageHistory(), RecordingHook()
    wrapped = DemotingChatMessageHistory(inner, Demoter(SlidingWindow.last_messages(2), hook), "c")
    wrapped.add_messages([HumanMessage("q0"), AIMessage("a0"), HumanMessage("q1"), AIMessage("a1")])
    return wrapped, inner, hook


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("case", list(BAD_LISTS))
def test_non_messages_are_refused_and_nothing_is_stored(case: str, flavour: str) -> None:
    wrapped, inner, hook = history()
    before, window = list(inner.messages), wrapped.messages
    bad, match = BAD_LISTS[case]
    with pytest.raises(MessageTypeError, match=match) as caught:
        if flavour == "sync":
            wrapped.add_messages(bad)
        else:
            asyncio.run(wrapped.aadd_messages(bad))
    assert isinstance(caught.value, DemoteError) and isinstance(caught.value, TypeError)
    assert inner.messages == before, "nothing stored"
    assert wrapped.messages == window, "reads still work"
    assert [i for _, _, i, _ in hook.records()] == [0, 1], "demoted once, before the error"


@pytest.mark.parametrize("bad", [None, "hello", {"role": "user"}])
def test_add_message_refuses_a_non_message(bad: Any) -> None:
    wrapped, inner, _ = history()
    before = list(inner.messages)
    with pytest.raises(MessageTypeError, match="message: expected a BaseMessage"):
        wrapped.add_message(bad)
    assert inner.messages == before


def test_the_frameworks_string_helpers_still_work() -> None:
    # BaseChatMessageHistory turns a string into a message before add_message.
    wrapped, inner, _ = history()
    wrapped.add_user_message("q2")
    wrapped.add_ai_message("a2")
    assert [m.text for m in inner.messages[-2:]] == ["q2", "a2"]
    assert [m.text for m in wrapped.messages] == ["q2", "a2"]
