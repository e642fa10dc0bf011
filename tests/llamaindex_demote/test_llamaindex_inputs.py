"""What DemotingMemory refuses (non-messages, before storing them) and accepts (session_id)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.memory import Memory

from demote import (
    ConfigError,
    DemoteError,
    Demoter,
    MessageTypeError,
    NoopHook,
    SlidingWindow,
)
from llamaindex_demote import DemotingMemory
from tests.conformance.contract import RecordingHook


def memory() -> DemotingMemory:
    m = DemotingMemory.from_defaults(
        demoter=Demoter(SlidingWindow.last_messages(2), RecordingHook()), chat_store_key="c"
    )
    m.put_messages([ChatMessage(role="user", content=f"m{i}") for i in range(4)])
    return m


CASES: dict[str, tuple[str, Any, str]] = {
    "put-none": ("put", None, r"message: expected a ChatMessage, got NoneType"),
    "put-str": ("put", "hello", r"message: expected a ChatMessage, got str"),
    "put_messages-str": ("put_messages", "hello", r"messages: expected a list of ChatMessage"),
    "put_messages-none-item": ("put_messages", [None], r"messages\[0\]: expected a ChatMessage"),
    "put_messages-dict": ("put_messages", {"role": "user"}, r"messages: expected a list"),
    "set-none-item": ("set", [ChatMessage(content="x"), None], r"messages\[1\]: expected"),
    "set-str": ("set", "hello", r"messages: expected a list of ChatMessage, got str"),
}


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("case", list(CASES))
def test_non_messages_are_refused_and_nothing_is_stored(case: str, flavour: str) -> None:
    m = memory()
    before, window = m.get_all(), m.get()
    method, bad, match = CASES[case]
    with pytest.raises(MessageTypeError, match=match) as caught:
        if flavour == "sync":
            getattr(m, method)(bad)
        else:
            asyncio.run(getattr(m, "a" + method)(bad))
    assert isinstance(caught.value, DemoteError) and isinstance(caught.value, TypeError)
    assert m.get_all() == before, "nothing stored"
    assert m.get() == window, "reads still work"


def test_from_defaults_refuses_a_bad_chat_history() -> None:
    with pytest.raises(MessageTypeError, match=r"chat_history\[0\]"):
        DemotingMemory.from_defaults(hook=NoopHook(), token_limit=100, chat_history=[None])  # type: ignore[list-item]


def test_session_id_is_the_chat_store_key() -> None:
    """``Memory.from_defaults(session_id=...)`` names the conversation; so does ours."""
    theirs = Memory.from_defaults(session_id="user-7", token_limit=1000)
    ours = DemotingMemory.from_defaults(hook=NoopHook(), session_id="user-7", token_limit=1000)
    assert ours.chat_store_key == ours.session_id == theirs.session_id == "user-7"
    ours.put(ChatMessage(role="user", content="hi"))
    assert ours.demoter.tracked_conversations() == 0  # nothing demoted, nothing tracked
    assert ours.chat_store.get_keys() == ["user-7"]
    same = DemotingMemory.from_defaults(
        hook=NoopHook(), session_id="s", chat_store_key="s", token_limit=10
    )
    assert same.chat_store_key == "s"
    with pytest.raises(ConfigError, match="name two conversations"):
        DemotingMemory.from_defaults(
            hook=NoopHook(), session_id="a", chat_store_key="b", token_limit=10
        )
    assert (
        DemotingMemory.from_defaults(hook=NoopHook(), token_limit=10).session_id == "chat_history"
    )
