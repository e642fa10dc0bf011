"""DemotingMiddleware.erase: the LangGraph thread (through its checkpointer), the demotion
state and every tier, on real ``create_agent`` graphs; pruned threads keep their keys."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from demote import Demoter, Demotion, SlidingWindow, SQLiteStateStore
from demote.archive.sqlite import SQLiteArchive
from demote.erase import TierReport
from demote.errors import ConfigError
from langchain_demote import DemotingMiddleware
from langchain_demote.middleware import thread_conversation_id

LAST4 = SlidingWindow.last_messages(4)


class KeyShelf:
    """A long tail that deletes only by the ids it is given (as many vector stores)."""

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}
        self.asked: list[str] = []

    def deliver(self, batch: Demotion) -> None:
        self.rows.update({m.key: m.text for m in batch.messages})

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        self.asked = list(keys or ())
        gone = [k for k in self.asked if k in self.rows]
        for k in gone:
            del self.rows[k]
        return len(gone)


def agent(middleware: DemotingMiddleware, checkpointer: Any) -> Any:
    model = FakeListChatModel(responses=["Noted."])
    return create_agent(model, checkpointer=checkpointer, middleware=[middleware])


def chat(graph: Any, thread: str, turns: int, word: str) -> None:
    config = {"configurable": {"thread_id": thread}}
    for i in range(turns):
        graph.invoke({"messages": [("user", f"{word} note {i}")]}, config)


def test_erase_deletes_the_thread_the_state_and_the_archive(tmp_path: Path) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    middleware = DemotingMiddleware(Demoter(LAST4, archive), recall=archive)
    saver = InMemorySaver()
    graph = agent(middleware, saver)
    chat(graph, "t1", 6, "quokka7741")
    chat(graph, "t2", 6, "heron")
    assert archive.count("t1") == 8 and archive.count("t2") == 8

    report = middleware.erase("t1", checkpointer=saver)

    assert report.complete and report.found
    assert report.touched == (
        TierReport("InMemorySaver", "erased", 12, kind="checkpoint"),
        TierReport("SQLiteArchive", "erased", 8),
        TierReport("InMemoryStateStore", "erased", 1, kind="state"),
    ), "the checkpoint, the long tail, the state: every tier it touched, in order"
    assert saver.get_tuple({"configurable": {"thread_id": "t1"}}) is None
    assert archive.count("t1") == 0 and archive.search("t1", "quokka7741") == []
    assert middleware.demoter.state.get("t1") is None
    assert archive.count("t2") == 8 and graph.get_state({"configurable": {"thread_id": "t2"}})
    chat(graph, "t1", 3, "fresh")  # the thread starts over
    assert [m.text for m in archive.messages("t1")] == ["fresh note 0", "Noted."]


def test_a_pruned_thread_hands_the_keys_its_messages_were_delivered_under(
    tmp_path: Path,
) -> None:
    shelf = KeyShelf()
    state = SQLiteStateStore(tmp_path / "state.db")  # lives and dies with the threads' file
    middleware = DemotingMiddleware(Demoter(LAST4, shelf, state=state), prune_state=True)
    with SqliteSaver.from_conn_string(str(tmp_path / "threads.db")) as saver:
        graph = agent(middleware, saver)
        chat(graph, "t1", 8, "pruned")
        kept = graph.get_state({"configurable": {"thread_id": "t1"}}).values["messages"]
        assert len(kept) < 16 and len(shelf.rows) == 12
        report = middleware.erase("t1", checkpointer=saver)
        assert report.inner == TierReport("SqliteSaver", "erased", len(kept), kind="checkpoint")
        assert report.complete
        # The pruned messages' keys are gone with them (a store that finds documents by
        # metadata reaches those); the kept, delivered one is found by its true key.
        assert report.tiers[0].removed == 1 and len(shelf.rows) == 11
        assert len(shelf.asked) == len(kept)
        assert saver.get_tuple({"configurable": {"thread_id": "t1"}}) is None


async def test_aerase_on_an_async_agent(tmp_path: Path) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    middleware = DemotingMiddleware(Demoter(LAST4, archive))
    saver = InMemorySaver()
    graph = agent(middleware, saver)
    for i in range(5):
        await graph.ainvoke(
            {"messages": [("user", f"secret {i}")]}, {"configurable": {"thread_id": "a"}}
        )
    report = await middleware.aerase("a", checkpointer=saver)
    assert report.complete and archive.count("a") == 0
    assert report.inner == TierReport("InMemorySaver", "erased", 10, kind="checkpoint")
    assert await saver.aget_tuple({"configurable": {"thread_id": "a"}}) is None


def test_without_a_checkpointer_only_the_conversation_is_erased(tmp_path: Path) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    middleware = DemotingMiddleware(Demoter(LAST4, archive))
    graph = agent(middleware, None)
    messages: list[Any] = []
    for i in range(4):
        messages = graph.invoke({"messages": [*messages, ("user", f"hi {i}")]})["messages"]
    (cid,) = archive.conversations()
    assert cid.startswith("first-message:")
    report = middleware.erase(cid)
    assert report.complete and report.inner is None and archive.count() == 0


def test_a_custom_conversation_id_must_be_named() -> None:
    middleware = DemotingMiddleware(
        Demoter(LAST4), conversation_id=lambda rt: thread_conversation_id(rt) + "/bot"
    )
    with pytest.raises(ConfigError, match="conversation_id"):
        middleware.erase("t1", checkpointer=InMemorySaver())
    report = middleware.erase("t1", checkpointer=InMemorySaver(), conversation_id="t1/bot")
    assert report.inner == TierReport("InMemorySaver", "erased", 0, kind="checkpoint")
    assert report.state.removed == 0 and report.found is False, "a thread nothing knew"
    with pytest.raises(ConfigError, match="checkpointer"):
        middleware.erase("t1", checkpointer=object(), conversation_id="t1/bot")  # type: ignore[arg-type]
