"""Demotion events reach LangChain callback handlers inside the run that caused them.

A collecting ``BaseCallbackHandler`` records every run (with its parent) and every custom
event. Each ``"demote.*"`` event must carry the run id of the run that read the window
(``RunnableWithMessageHistory``'s history step, an agent's model node, a retriever),
whose root is the ``invoke`` of that turn, and the counts and keys must be exactly what
the hook received. Reads outside any run dispatch nothing and never fail.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from langgraph.checkpoint.memory import InMemorySaver

from demote import CallbackHook, DemoteEvent, Demoter, Demotion, SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from langchain_demote import DemotingChatMessageHistory, archive_retriever, with_demotion
from langchain_demote.callbacks import EVENT_PREFIX, dispatch_events
from langchain_demote.middleware import DemotingMiddleware
from tests.langchain_demote.support import RecordingChatModel


class Collector(BaseCallbackHandler):
    """Every run (name, parent), every custom event, and each chat model run's metadata."""

    def __init__(self) -> None:
        self.runs: dict[UUID, tuple[str, UUID | None]] = {}
        self.events: list[tuple[str, dict[str, Any], UUID]] = []
        self.model_runs: list[tuple[UUID, UUID | None, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def _run(self, run_id: UUID, parent: UUID | None, name: str) -> None:
        with self._lock:
            self.runs[run_id] = (name, parent)

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self._run(kwargs["run_id"], kwargs.get("parent_run_id"), str(kwargs.get("name")))

    def on_retriever_start(self, serialized: Any, query: str, **kwargs: Any) -> None:
        self._run(kwargs["run_id"], kwargs.get("parent_run_id"), "retriever")

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        run_id, parent = kwargs["run_id"], kwargs.get("parent_run_id")
        self._run(run_id, parent, "chat_model")
        with self._lock:
            self.model_runs.append((run_id, parent, dict(kwargs.get("metadata") or {})))

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self.events.append((name, data, run_id))

    def demote_events(self) -> list[tuple[str, dict[str, Any], UUID]]:
        return [e for e in self.events if e[0].startswith(EVENT_PREFIX)]

    def lineage(self, run_id: UUID) -> list[str]:
        """Names from ``run_id`` up to its root."""
        names: list[str] = []
        current: UUID | None = run_id
        while current is not None:
            name, current = self.runs[current]
            names.append(name)
        return names

    def root(self, run_id: UUID) -> UUID:
        while (parent := self.runs[run_id][1]) is not None:
            run_id = parent
        return run_id


class Delivered:
    """A hook that records each batch."""

    def __init__(self) -> None:
        self.batches: list[Demotion] = []

    def __call__(self, batch: Demotion) -> None:
        self.batches.append(batch)

    def keys(self) -> list[str]:
        return [m.key for b in self.batches for m in b.messages]


def observed(demoter: Demoter) -> tuple[list[DemoteEvent], threading.Condition]:
    seen: list[DemoteEvent] = []
    cond = threading.Condition()

    def observer(event: DemoteEvent) -> None:
        with cond:
            seen.append(event)
            cond.notify_all()

    demoter.observe(observer)
    return seen, cond


def wait_for(seen: list[DemoteEvent], cond: threading.Condition, n: int) -> None:
    with cond:
        assert cond.wait_for(lambda: len(seen) >= n, timeout=10), seen


# -- RunnableWithMessageHistory + with_demotion ---------------------------------------------


def chain_for(demoter: Demoter) -> tuple[RunnableWithMessageHistory, RecordingChatModel]:
    histories: dict[str, InMemoryChatMessageHistory] = {}

    def get_session_history(session_id: str) -> BaseChatMessageHistory:
        return histories.setdefault(session_id, InMemoryChatMessageHistory())

    model = RecordingChatModel()
    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | model,
        with_demotion(get_session_history, demoter),
        input_messages_key="question",
        history_messages_key="history",
    )
    return chain, model


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_chain_reports_each_turns_events_in_that_turns_run(mode: str) -> None:
    hook = Delivered()
    demoter = Demoter(SlidingWindow.last_turns(2), CallbackHook(hook))
    chain, _ = chain_for(demoter)
    collector = Collector()
    roots: list[UUID] = []

    async def run() -> None:
        for i in range(8):
            config: Any = {"configurable": {"session_id": "s1"}, "callbacks": [collector]}
            before = set(collector.runs)
            if mode == "sync":
                chain.invoke({"question": f"question {i}"}, config)
            else:
                await chain.ainvoke({"question": f"question {i}"}, config)
            new_roots = {r for r in set(collector.runs) - before if collector.runs[r][1] is None}
            assert len(new_roots) == 1
            roots.append(new_roots.pop())

    asyncio.run(run())
    events = collector.demote_events()
    assert events, "no demote event reached the handler"
    for name, data, run_id in events:
        # The run that read the history, inside RunnableWithMessageHistory's own steps.
        lineage = collector.lineage(run_id)
        assert lineage[0] == "load_history" and lineage[-1] == "RunnableWithMessageHistory"
        assert data["conversation_id"] == "s1" and name == EVENT_PREFIX + data["kind"]
    # Turn i (0-based) reads 2i messages: with a 2-turn window, turns 3..7 each demote
    # one turn group (2 messages) and deliver it, in that turn's run.
    per_turn: dict[int, list[tuple[str, int]]] = {}
    for name, data, run_id in events:
        per_turn.setdefault(roots.index(collector.root(run_id)), []).append((name, data["count"]))
    assert per_turn == {i: [("demote.demoted", 2), ("demote.delivered", 2)] for i in range(3, 8)}
    delivered = [k for n, d, _ in events if n == "demote.delivered" for k in d["keys"]]
    assert delivered == hook.keys() and len(delivered) == 10


def test_history_read_outside_a_run_dispatches_nothing_and_still_reaches_observers() -> None:
    hook = Delivered()
    demoter = Demoter(SlidingWindow.last_messages(2), CallbackHook(hook))
    seen, cond = observed(demoter)
    history = DemotingChatMessageHistory(InMemoryChatMessageHistory(), demoter, "plain")
    history.add_messages([HumanMessage(f"m{i}") if i % 2 == 0 else AIMessage(f"m{i}")
                          for i in range(6)])  # fmt: skip
    assert [m.text for m in history.messages] == ["m4", "m5"]  # no run: no failure
    wait_for(seen, cond, 2)
    assert [(e.kind, e.count) for e in seen] == [("demoted", 4), ("delivered", 4)]
    # An explicit config with handlers but no run: nothing to attach to, nothing raised.
    collector = Collector()
    assert not dispatch_events(seen, config={"callbacks": [collector]})
    assert collector.events == []


async def test_async_history_read_outside_a_run_does_not_fail() -> None:
    demoter = Demoter(SlidingWindow.last_messages(1))
    history = DemotingChatMessageHistory(InMemoryChatMessageHistory(), demoter, "plain")
    await history.aadd_messages([HumanMessage("a"), AIMessage("b"), HumanMessage("c")])
    assert [m.text for m in await history.aget_messages()] == ["c"]


def test_history_read_inside_a_lambda_reports_to_that_lambda() -> None:
    demoter = Demoter(SlidingWindow.last_messages(1))
    history = DemotingChatMessageHistory(InMemoryChatMessageHistory(), demoter, "lam")
    history.add_messages([HumanMessage("a"), AIMessage("b"), HumanMessage("c")])
    collector = Collector()
    reader = RunnableLambda(lambda _: history.messages, name="reader")
    reader.invoke(None, {"callbacks": [collector]})
    [(name, data, run_id)] = collector.demote_events()
    assert name == "demote.demoted" and data["count"] == 2
    assert collector.lineage(run_id) == ["reader"]
    # The second read of the same history is memoised: no load, no second event.
    reader.invoke(None, {"callbacks": [collector]})
    assert len(collector.demote_events()) == 1


# -- create_agent + DemotingMiddleware ------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_agent_reports_events_in_the_model_node_and_metadata_on_the_model_run(
    mode: str, tmp_path: Any
) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    demoter = Demoter(SlidingWindow.last_turns(2), archive)
    seen, cond = observed(demoter)
    model = RecordingChatModel()
    agent = create_agent(
        model,
        checkpointer=InMemorySaver(),
        middleware=[DemotingMiddleware(demoter, recall=archive, recall_k=2)],
    )
    collector = Collector()
    config: Any = {"configurable": {"thread_id": "agent-1"}, "callbacks": [collector]}
    questions = ["The locker code is 4512.", *(f"Small talk {i}." for i in range(5)),
                 "What was the locker code?"]  # fmt: skip

    async def run() -> None:
        for q in questions:
            if mode == "sync":
                agent.invoke({"messages": [("user", q)]}, config)
            else:
                await agent.ainvoke({"messages": [("user", q)]}, config)

    asyncio.run(run())
    archive_keys = {r.key for r in archive.messages("agent-1")}
    events = collector.demote_events()
    for _, _, run_id in events:
        assert collector.lineage(run_id)[0] == "model"  # the model node's run
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for name, data, _ in events:
        by_kind.setdefault(name, []).append(data)
    # 7 turns of 2 messages, a window of the last 2 turns at each model call: turn i
    # (0-based) sends 2i + 1 messages, so from turn 2 on each call cuts one more group.
    assert [d["count"] for d in by_kind["demote.demoted"]] == [2] * 5
    assert sum(d["count"] for d in by_kind["demote.delivered"]) == archive.count("agent-1") == 10
    assert {k for d in by_kind["demote.delivered"] for k in d["keys"]} == archive_keys
    # Recall ran on every turn that had a long tail; the last one found the locker code.
    recalled = by_kind["demote.recalled"]
    assert recalled[-1]["count"] >= 1
    assert all("locker" not in json.dumps(d) for d in recalled)  # never the query text
    # The chat model's run is a child of the same model node and carries the window.
    assert len(collector.model_runs) == len(questions) == len(model.seen)
    for (_, parent, metadata), sent in zip(collector.model_runs, model.seen, strict=True):
        assert collector.runs[parent][0] == "model"
        info = metadata["demote"]
        assert info["conversation_id"] == "agent-1"
        assert info["pinned"] + info["window"] + (1 if info["recalled"] else 0) == len(sent)
        assert info["cut"] + info["pinned"] + info["window"] == info["total"]
    assert [m["demote"]["cut"] for _, _, m in collector.model_runs] == [0, 0, 2, 4, 6, 8, 10]
    # The same events reached the Demoter's observers, recall included.
    wait_for(seen, cond, len(events))
    assert sorted(e.kind for e in seen) == sorted(d["kind"] for _, d, _ in events)


# -- the archive retriever ------------------------------------------------------------------


def test_retriever_reports_its_recall_in_its_own_run(tmp_path: Any) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    demoter = Demoter(SlidingWindow.last_messages(1), archive)
    history = DemotingChatMessageHistory(InMemoryChatMessageHistory(), demoter, "r1")
    history.add_messages([HumanMessage("The tent leaked in June."), AIMessage("Noted."),
                          HumanMessage("Anything else?")])  # fmt: skip
    assert len(history.messages) == 1  # two messages archived
    seen, cond = observed(demoter)
    retriever = archive_retriever(archive, "r1", k=3, demoter=demoter)
    collector = Collector()
    began = time.perf_counter()
    docs = retriever.invoke("when did the tent leak?", {"callbacks": [collector]})
    took = time.perf_counter() - began
    [(name, data, run_id)] = collector.demote_events()
    assert name == "demote.recalled" and collector.lineage(run_id) == ["retriever"]
    assert data["count"] == len(docs) >= 1
    assert data["keys"] == [d.metadata["key"] for d in docs]
    assert 0 <= data["duration"] <= took
    assert "tent" not in json.dumps(data)
    wait_for(seen, cond, 1)
    assert seen[0].kind == "recalled" and list(seen[0].keys) == data["keys"]


def test_retriever_refuses_a_demoter_that_is_not_one(tmp_path: Any) -> None:
    from demote.errors import ConfigError

    with pytest.raises(ConfigError, match="demoter: expected a Demoter"):
        archive_retriever(SQLiteArchive(tmp_path / "a.db"), "r1", demoter=object())  # type: ignore[arg-type]
