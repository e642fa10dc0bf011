"""A durable checkpointer or chat history beside an in-memory demotion state warns, once.

Why it warns: a restarted process keeps the thread (``SqliteSaver``) but not the
demotion state, so it hands a hook of one's own what it already delivered. The fix it
names (a durable state store) is checked too.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import demote.restarts
from demote import Demoter, DemoteWarning, Demotion, SlidingWindow, SQLiteStateStore
from langchain_demote import DemotingChatMessageHistory, DemotingMiddleware
from tests.langchain_demote.support import FileChatMessageHistory

LAST4 = SlidingWindow.last_messages(4)
WARNED = "keeps conversations across restarts"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Fail on any DemoteWarning inside."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DemoteWarning)
        yield


def run_agent(saver: Any, demoter: Demoter, turns: range) -> None:
    agent = create_agent(
        FakeListChatModel(responses=["Noted."]),
        checkpointer=saver,
        middleware=[DemotingMiddleware(demoter)],
    )
    for i in turns:
        agent.invoke({"messages": [("user", f"note {i}")]}, {"configurable": {"thread_id": "t"}})


def test_a_restart_with_in_memory_state_hands_a_plain_hook_what_it_had(tmp_path: Path) -> None:
    """What the warning is about: one process, then a restarted one, on one SqliteSaver."""
    got: list[str] = []

    def keep(batch: Demotion) -> None:  # a hook of one's own, without dedup
        got.extend(m.key for m in batch.messages)

    for turns in (range(0, 5), range(5, 7)):  # each a fresh process: a new Demoter
        demote.restarts._warned = False  # (as in a new process)
        with (
            SqliteSaver.from_conn_string(str(tmp_path / "threads.db")) as saver,
            pytest.warns(DemoteWarning, match=f"SqliteSaver {WARNED}"),
        ):
            run_agent(saver, Demoter(LAST4, keep), turns)
    assert len(got) > len(set(got)), "the restarted process re-delivered what it had"
    got.clear()
    state = SQLiteStateStore(tmp_path / "state.db")  # the fix the warning names
    for turns in (range(0, 5), range(5, 7)):
        with SqliteSaver.from_conn_string(str(tmp_path / "fixed.db")) as saver, quiet():
            run_agent(saver, Demoter(LAST4, keep, state=state), turns)
    assert got and len(got) == len(set(got)), "with a durable state: once each"
    state.close()


def test_the_middleware_warns_once_per_process_and_not_for_in_memory_savers(
    tmp_path: Path,
) -> None:
    with quiet():
        run_agent(InMemorySaver(), Demoter(LAST4, print), range(1))  # dies with the process
        run_agent(None, Demoter(LAST4, print), range(1))  # no checkpointer at all
    with SqliteSaver.from_conn_string(str(tmp_path / "threads.db")) as saver:
        with pytest.warns(DemoteWarning, match=r"state=SQLiteStateStore\("):
            run_agent(saver, Demoter(LAST4, lambda batch: None), range(2))
        with quiet():
            run_agent(saver, Demoter(LAST4, lambda batch: None), range(2, 4))  # once


def test_a_durable_chat_history_warns_at_the_callers_line(tmp_path: Path) -> None:
    demoter = Demoter(LAST4, lambda batch: None)
    with pytest.warns(DemoteWarning, match=f"FileChatMessageHistory {WARNED}") as caught:
        DemotingChatMessageHistory(FileChatMessageHistory(tmp_path / "h.json"), demoter, "c")
    assert caught[0].filename == __file__
    with quiet():
        history = DemotingChatMessageHistory(InMemoryChatMessageHistory(), demoter, "m")
        durable = Demoter(LAST4, lambda batch: None, state=SQLiteStateStore(tmp_path / "s.db"))
        DemotingChatMessageHistory(FileChatMessageHistory(tmp_path / "h.json"), durable, "c")
    history.add_messages([HumanMessage(f"m{i}") for i in range(6)])
    assert len(history.messages) == 4
    durable.state.close()
