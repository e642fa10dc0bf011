"""Where ``DemotingMemory.from_defaults`` sends demoted messages when no hook is given.

It keeps LlamaIndex's shape (``token_limit=`` alone sizes a window, so
``memory_cls=DemotingMemory`` works), and says, with a :class:`~demote.DemoteWarning`
naming the caller's line, that the messages leaving the window then reach no long tail.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM

from demote import Demoter, DemoteWarning, NoopHook, SlidingWindow, SQLiteArchive
from llamaindex_demote import DemotingMemory


def test_from_defaults_without_a_hook_warns_where_demoted_messages_go() -> None:
    with pytest.warns(DemoteWarning, match="no long tail") as caught:
        memory = DemotingMemory.from_defaults(token_limit=100)
    (warning,) = caught
    assert warning.filename == __file__, "the warning names the caller's line"
    assert "hook=SQLiteArchive(" in str(warning.message)
    assert "hook=NoopHook()" in str(warning.message), "and how to say a window alone is meant"
    assert isinstance(memory.demoter.hook, NoopHook)
    with pytest.warns(DemoteWarning, match="no long tail"):
        DemotingMemory.from_defaults(policy=SlidingWindow.last_messages(4))


def test_a_memory_built_by_a_chat_engine_from_memory_cls_warns_too() -> None:
    with pytest.warns(DemoteWarning, match="no long tail"):
        engine = SimpleChatEngine.from_defaults(
            llm=MockLLM(max_tokens=3), memory_cls=DemotingMemory
        )
    engine.chat("hi")
    assert isinstance(engine._memory, DemotingMemory)


def test_a_hook_a_demoter_or_an_explicit_noop_hook_is_silent(tmp_path: Path) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DemotingMemory.from_defaults(token_limit=100, hook=NoopHook())  # a window alone
        memory = DemotingMemory.from_defaults(token_limit=20, hook=archive, chat_store_key="c")
        DemotingMemory.from_defaults(demoter=Demoter(SlidingWindow.last_messages(2)))
    memory.put_messages([ChatMessage(role="user", content=f"message {i} " * 5) for i in range(6)])
    memory.get()
    memory.demoter.drain(5)
    assert archive.count("c") > 0, "the hook given is where demoted messages go"
    archive.close()
