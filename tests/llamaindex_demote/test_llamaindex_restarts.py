"""A durable chat store beside an in-memory demotion state warns, once per process.

``SimpleChatStore`` (LlamaIndex's default, in memory) and a durable state store beside a
durable chat store are quiet; anything else warns, naming the chat store and the fix.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.storage.chat_store import SimpleChatStore

from demote import Demoter, DemoteWarning, Demotion, SlidingWindow, SQLiteStateStore
from llamaindex_demote import DemotingMemory
from tests.llamaindex_demote.support import FileChatStore

LAST4 = SlidingWindow.last_messages(4)


def test_a_durable_chat_store_with_an_in_memory_state_warns_once(tmp_path: Path) -> None:
    got: list[str] = []

    def keep(batch: Demotion) -> None:
        got.extend(m.key for m in batch.messages)

    with pytest.warns(DemoteWarning, match="FileChatStore keeps conversations across") as caught:
        memory = DemotingMemory.from_defaults(
            demoter=Demoter(LAST4, keep), chat_store=FileChatStore(path=tmp_path / "chats.json")
        )
    assert caught[0].filename == __file__ and "state=SQLiteStateStore(" in str(caught[0].message)
    memory.put_messages([ChatMessage(role="user", content=f"m{i}") for i in range(6)])
    memory.get()
    # A restart: the chat store is still there, the state is not; the hook gets it again.
    again = DemotingMemory.from_defaults(
        demoter=Demoter(LAST4, keep), chat_store=FileChatStore(path=tmp_path / "chats.json")
    )  # (no second warning in this process)
    again.get()
    assert len(got) == 4 and len(set(got)) == 2, "re-delivered after the restart"


def test_in_memory_chat_stores_and_durable_states_are_quiet(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DemoteWarning)
        DemotingMemory.from_defaults(demoter=Demoter(LAST4, print))  # SimpleChatStore
        DemotingMemory.from_defaults(demoter=Demoter(LAST4, print), chat_store=SimpleChatStore())
        state = SQLiteStateStore(tmp_path / "state.db")
        DemotingMemory.from_defaults(
            demoter=Demoter(LAST4, print, state=state),
            chat_store=FileChatStore(path=tmp_path / "chats.json"),
        )
    state.close()
